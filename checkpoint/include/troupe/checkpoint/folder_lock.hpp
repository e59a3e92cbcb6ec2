// FolderLock: one job per checkpoint folder.
//
//   checkpoint::FolderLock lock(dir, run_id);   // throws CheckpointError naming the owner
//
// Two jobs saving into one folder overwrite each other's checkpoints, and one resumes
// the other's weights. The lock is <dir>/.troupe-lock: an flock, held while the lock
// lives, plus one line naming the owner (run id, host, pid) and a lease that a thread
// renews every lease/4. The flock stops a second job at once where the file system
// carries locks; the lease is what a host that cannot see the holder's flock (a shared
// file system without them) goes by. A lock is taken over when:
//   - it was released (its lease says 0), or its lease has expired;
//   - its owner is this run again (the same run id: troupe-run's relaunch of the job);
//   - its owner ran on this host and its process is gone.
// Otherwise a lease that is still running is waited out for at most one lease (its
// owner may have died on another host), unless it is renewed meanwhile: then the owner
// is alive, and the lock is refused with who holds it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace troupe::checkpoint {

class FolderLock {
 public:
  struct Owner {
    std::string run_id;
    std::string host;
    pid_t pid = 0;
    double lease_until = 0;  // seconds since the epoch; 0: released
  };

  // Takes the lock of `folder` (created if missing) for run `run_id` (may be empty: a
  // run outside troupe-run). `lease` is how long it holds without renewal; 60 s, or
  // TROUPE_LOCK_LEASE_S when set.
  FolderLock(const std::filesystem::path& folder, std::string run_id,
             std::optional<std::chrono::milliseconds> lease = std::nullopt);
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();  // releases: the next job takes the folder at once

  // What the folder's lock file says, if it names an owner.
  static std::optional<Owner> owner_of(const std::filesystem::path& folder);

 private:
  void write_record(double lease_until);
  void renew_loop();

  std::filesystem::path path_;
  std::string run_id_;
  std::chrono::milliseconds lease_;
  int fd_ = -1;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread renewer_;
};

}  // namespace troupe::checkpoint
