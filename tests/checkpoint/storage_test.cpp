// Faults of storage and of the folder, as resume and save must meet them: a file that
// cannot be read now is retried, then a loud StorageError -- never "damaged", never an
// older file, never a fresh start; a damaged file is set aside and never counted; a
// folder with history never starts over unless asked; stray names never crash; a disk
// without room for another checkpoint fails the save before a byte is written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "../small_disk.hpp"
#include "test_util.hpp"
#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/folder_lock.hpp"

namespace troupe::checkpoint {
namespace {

namespace fs = std::filesystem;
using tensor::DType;
using tensor::Tensor;

Tensor state_of(std::int64_t step) {
  return testing::random_tensor({64, 64}, DType::f32, static_cast<std::uint32_t>(step));
}

// A Checkpoint of one tensor whose value is a function of the step, with its warnings kept.
struct Trial {
  explicit Trial(const fs::path& folder, std::size_t keep_last = 3) : ckpt(folder, keep_last) {
    ckpt.set_warning_handler([this](const std::string& w) { warnings.push_back(w); });
    ckpt.set_storage_retry(std::chrono::milliseconds(300));
    ckpt.register_state("model", {.save = [this](SectionWriter& w) { w.tensor("w", state_of(step)); },
                                  .load = [this](const SectionReader& r) { loaded = r.tensor("w"); }});
  }
  void save(std::int64_t s) {
    step = s;
    ckpt.save(s);
  }
  std::string all_warnings() const {
    std::string out;
    for (const std::string& w : warnings) out += w + "\n";
    return out;
  }
  Checkpoint ckpt;
  std::int64_t step = 0;
  Tensor loaded;
  std::vector<std::string> warnings;
};

// An exclusive flock, as another process (a copy, a backup, a second job) would hold it:
// HDF5 takes a shared one to open a file, and gets EAGAIN.
class FileLock {
 public:
  explicit FileLock(const fs::path& file) : fd_(::open(file.c_str(), O_RDONLY | O_CLOEXEC)) {
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(::flock(fd_, LOCK_EX | LOCK_NB), 0);
  }
  ~FileLock() { release(); }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

void truncate_to(const fs::path& file, std::uintmax_t size) { fs::resize_file(file, size); }

TEST(StorageFaults, ANewestFileLockedForAMomentIsRetriedAndLoaded) {
  testing::TempDir dir;
  {
    Trial writer(dir.path());
    writer.save(1);
    writer.save(2);
  }
  FileLock lock(dir / "ckpt-000000002.h5");
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    lock.release();
  });
  Trial reader(dir.path());
  std::optional<Metadata> meta = reader.ckpt.load_latest();
  releaser.join();
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->step, 2);
  EXPECT_TRUE(testing::same_bits(reader.loaded, state_of(2)));
  EXPECT_NE(reader.all_warnings().find("retrying"), std::string::npos) << reader.all_warnings();
  EXPECT_EQ(reader.all_warnings().find("skipping"), std::string::npos) << reader.all_warnings();
  EXPECT_TRUE(reader.ckpt.directory().quarantined().empty());
}

TEST(StorageFaults, AFileThatStaysUnreadableFailsLoudlyAndNothingIsSkippedOrMoved) {
  testing::TempDir dir;
  {
    Trial writer(dir.path());
    writer.save(1);
    writer.save(2);
  }
  FileLock lock(dir / "ckpt-000000002.h5");
  Trial reader(dir.path());
  try {
    reader.ckpt.load_latest();
    FAIL() << "a locked newest checkpoint must not be skipped";
  } catch (const StorageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ckpt-000000002.h5"), std::string::npos) << what;
    EXPECT_NE(what.find("EAGAIN"), std::string::npos) << what;
    EXPECT_NE(what.find("not damage"), std::string::npos) << what;
  }
  EXPECT_FALSE(reader.loaded.defined());  // step 1 was not taken instead
  EXPECT_EQ(reader.ckpt.directory().list().size(), 2u);
  EXPECT_TRUE(reader.ckpt.directory().quarantined().empty());
}

TEST(StorageFaults, ADamagedNewestFileIsSetAsideNeverCountedAndTheOlderOneLoads) {
  testing::TempDir dir;
  {
    Trial writer(dir.path(), 2);
    writer.save(1);
    writer.save(2);
  }
  truncate_to(dir / "ckpt-000000002.h5", 3000);
  Trial run(dir.path(), 2);
  std::optional<Metadata> meta = run.ckpt.load_latest();
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->step, 1);
  EXPECT_TRUE(fs::exists(dir / "ckpt-000000002.h5.damaged"));
  EXPECT_NE(run.all_warnings().find("set aside as ckpt-000000002.h5.damaged"), std::string::npos) << run.all_warnings();
  // Two more saves with keep_last 2: the damaged file is neither counted nor deleted.
  run.save(2);
  run.save(3);
  EXPECT_EQ(run.ckpt.directory().list(), (std::vector<fs::path>{dir / "ckpt-000000002.h5", dir / "ckpt-000000003.h5"}));
  EXPECT_TRUE(fs::exists(dir / "ckpt-000000002.h5.damaged"));
}

TEST(StorageFaults, AFolderWhoseCheckpointsAreAllDamagedIsAnErrorNotAFreshStart) {
  testing::TempDir dir;
  {
    Trial writer(dir.path());
    writer.save(1);
    writer.save(2);
  }
  truncate_to(dir / "ckpt-000000001.h5", 100);
  truncate_to(dir / "ckpt-000000002.h5", 100);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second finds only files set aside
    Trial run(dir.path());
    try {
      run.ckpt.load_latest();
      FAIL() << "attempt " << attempt << ": resumed from nothing";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("Not starting over from step 0"), std::string::npos) << e.what();
    }
  }
  Trial fresh(dir.path());
  const fs::path aside = fresh.ckpt.start_fresh();
  EXPECT_EQ(aside.parent_path(), dir.path());
  EXPECT_TRUE(fs::exists(aside / "ckpt-000000002.h5.damaged"));
  EXPECT_TRUE(fs::exists(aside / "latest"));
  EXPECT_FALSE(fresh.ckpt.load_latest());
  fresh.save(5);
  EXPECT_EQ(Trial(dir.path()).ckpt.load_latest()->step, 5);
}

TEST(StorageFaults, StrayNamesInTheFolderAreIgnoredNeverACrash) {
  testing::TempDir dir;
  {
    Trial writer(dir.path());
    writer.save(1);
  }
  for (const char* name :
       {".ckpt-000000001.h5.tmp-99999999999999999999", ".ckpt-000000001.h5.tmp-", ".ckpt-x.h5.tmp--5", "ckpt-1.h5",
        "ckpt-0000000001.h5", "ckpt-00000000a.h5", "latest.tmp-abc", "notes.txt"})
    std::ofstream(dir / name) << "stray";
  // A save in flight on another host (a shared folder): its writer cannot be seen from
  // here, so it is not debris.
  std::ofstream(dir / ".ckpt-000000002.h5.tmp-some-other-host-1") << "in flight";
  Trial run(dir.path());
  EXPECT_TRUE(run.ckpt.directory().debris().empty());
  ASSERT_TRUE(run.ckpt.load_latest());
  run.save(3);
  EXPECT_TRUE(fs::exists(dir / ".ckpt-000000002.h5.tmp-some-other-host-1"));
  EXPECT_EQ(run.ckpt.directory().list().size(), 2u);
}

TEST(StorageFaults, TempNamesCarryTheHostAndThePid) {
  testing::TempDir dir;
  CheckpointDirectory folder(dir.path());
  const std::string name = folder.temp_path(7).filename().string();
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(name.rfind(".ckpt-000000007.h5.tmp-", 0), 0u) << name;
  EXPECT_NE(name.find("-" + std::to_string(::getpid())), std::string::npos) << name;
  EXPECT_EQ(name.substr(name.size() - std::to_string(::getpid()).size()), std::to_string(::getpid()));
}

using test_support::SmallDisk;

// Too little room for another checkpoint fails a save before it writes a byte.
TEST(StorageFaults, ADiskWithoutRoomForAnotherCheckpointFailsTheSaveBeforeWriting) {
  testing::TempDir dir;
  SmallDisk disk(dir / "small", 512 << 10);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  Trial run(dir / "small" / "ckpt", 0);
  run.save(1);
  run.save(2);
  std::ofstream(dir / "small" / "filler", std::ios::binary)
      << std::string(static_cast<std::size_t>(fs::space(dir / "small").available) - 1000, 'x');
  try {
    run.save(3);
    FAIL() << "a save into a full disk succeeded";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("ENOSPC"), std::string::npos) << e.what();
  }
  const auto names = run.ckpt.directory().list();
  EXPECT_EQ(names.size(), 2u);
  for (const auto& entry : fs::directory_iterator(dir / "small" / "ckpt"))  // no temporary file left behind
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  Trial reader(dir / "small" / "ckpt");
  EXPECT_EQ(reader.ckpt.load_latest()->step, 2);
  // The same bytes as an old checkpoint a killed process was deleting are room: the
  // next save deletes them before it checks.
  const fs::path left = dir / "small" / "ckpt" / ".ckpt-000000000.h5.going-elsewhere-77";
  fs::rename(dir / "small" / "filler", left);
  run.save(3);
  EXPECT_FALSE(fs::exists(left));
  EXPECT_EQ(run.ckpt.directory().list().size(), 3u);
}

// ENOSPC part way through a file (no earlier checkpoint to size the free-space check
// by): the save fails with the errno, leaves no temporary file, and the process exits
// cleanly afterwards -- HDF5 closes what is left open at exit, which once crashed. In a
// child, so that a crash shows as a signal.
TEST(StorageFaults, ADiskThatFillsDuringASaveFailsItAndTheProcessStillExitsCleanly) {
  testing::TempDir dir;
  SmallDisk disk(dir / "small", 32 << 10);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 0;
    {
      Checkpoint ckpt(dir / "small" / "ckpt", 0);
      ckpt.register_state("model", {.save =
                                        [](SectionWriter& w) {
                                          w.tensor("w", testing::random_tensor({128, 128}, DType::f32, 1));  // 64 KB
                                        },
                                    .load = [](const SectionReader&) {}});
      try {
        ckpt.save(1);
        status = 10;
      } catch (const StorageError& e) {
        status = std::string(e.what()).find("ENOSPC") == std::string::npos ? 11 : 0;
      } catch (...) {
        status = 12;
      }
      for (const auto& entry : fs::directory_iterator(dir / "small" / "ckpt"))
        if (entry.path().filename().string().find(".tmp-") != std::string::npos) status = 13;
      std::fflush(nullptr);
    }
    std::exit(status);  // atexit handlers run: HDF5's own shutdown included
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: saved into a full disk, 11: no ENOSPC in the error, 12: not a "
                                       "StorageError, 13: temporary file left";
}

TEST(FolderLocks, ASecondJobIsRefusedNamingTheFirstUntilItReleases) {
  testing::TempDir dir;
  std::optional<FolderLock> first(std::in_place, dir.path(), "run-a");
  const auto owner = FolderLock::owner_of(dir.path());
  ASSERT_TRUE(owner);
  EXPECT_EQ(owner->run_id, "run-a");
  EXPECT_EQ(owner->pid, ::getpid());
  try {
    FolderLock second(dir.path(), "run-b");
    FAIL() << "two jobs in one folder";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("in use by run 'run-a'"), std::string::npos) << e.what();
  }
  first.reset();
  EXPECT_NO_THROW(FolderLock(dir.path(), "run-b"));
  EXPECT_EQ(FolderLock::owner_of(dir.path())->lease_until, 0);  // released
}

// A lock whose holder another host cannot see (no flock there): its lease decides. A
// lease that is renewed is a live owner; one that runs out is taken over.
TEST(FolderLocks, ALeaseFromAnotherHostIsWaitedOutOrRefusedWhileRenewed) {
  testing::TempDir dir;
  const auto write_lease = [&](double until) {
    std::ofstream(dir / ".troupe-lock") << "run=other host=elsewhere pid=4242 lease_until=" << std::fixed << until
                                        << "\n";
  };
  const auto now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  write_lease(now() + 0.6);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(FolderLock(dir.path(), "mine", std::chrono::milliseconds(2000)));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(waited, 0.4);
  EXPECT_LT(waited, 2.0);

  write_lease(now() + 0.5);
  std::thread renewer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    write_lease(now() + 5);
  });
  EXPECT_THROW(FolderLock(dir.path(), "mine", std::chrono::milliseconds(2000)), CheckpointError);
  renewer.join();
  // The same run again (troupe-run's relaunch) takes it over at once.
  write_lease(now() + 30);
  std::ofstream(dir / ".troupe-lock") << "run=mine host=elsewhere pid=4242 lease_until=" << std::fixed << now() + 30
                                      << "\n";
  EXPECT_NO_THROW(FolderLock(dir.path(), "mine", std::chrono::milliseconds(2000)));
}

}  // namespace
}  // namespace troupe::checkpoint
