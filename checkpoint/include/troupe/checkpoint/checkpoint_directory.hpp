// CheckpointDirectory: the crash-safe life of checkpoint files in one folder.
//
//   <dir>/ckpt-000001200.h5     one per saved step (9 digits, so names sort by step)
//   <dir>/latest                the file name of the newest durable checkpoint
//   <dir>/.ckpt-000001300.h5.tmp-<host>-<pid>   a save in progress (or debris of a killed one)
//   <dir>/ckpt-000001100.h5.damaged             a file resume found damaged, set aside
//   <dir>/.ckpt-000001000.h5.going-<host>-<pid>  a checkpoint past keep_last, being deleted
//
// A save writes the temporary file, then commit() fsyncs it, renames it to its final
// name, fsyncs the directory, rewrites `latest` the same way, and only then lets
// checkpoints beyond keep_last go: renamed aside and deleted on a thread, so the save
// does not wait for a large file's blocks to be freed. A crash at any point leaves every
// earlier checkpoint and a `latest` that names a complete file (or the previous one). A
// temporary file is debris only when its writer is provably gone: written on this host
// by a process that no longer runs. Readers never look at temporary or set-aside files;
// the next commit deletes debris, and set-aside files a process left as it ended.
// Damaged files are renamed, never deleted, and never counted by keep_last. Any other
// name in the folder is left alone.
//
// Only one process should save into a folder; any number may read it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <future>
#include <optional>
#include <vector>

namespace troupe::checkpoint {

class CheckpointDirectory {
 public:
  // Creates the folder if needed. keep_last == 0 keeps every checkpoint.
  explicit CheckpointDirectory(std::filesystem::path folder, std::size_t keep_last = 3);

  const std::filesystem::path& folder() const { return folder_; }
  std::size_t keep_last() const { return keep_last_; }

  std::filesystem::path final_path(std::int64_t step) const;  // <dir>/ckpt-000000042.h5
  std::filesystem::path temp_path(std::int64_t step) const;   // <dir>/.ckpt-000000042.h5.tmp-<pid>
  // Makes the finished temporary file the checkpoint of `step` (see above); returns its path.
  std::filesystem::path commit(const std::filesystem::path& temp, std::int64_t step);

  // Checkpoint files, oldest step first. Temporary files are never listed.
  std::vector<std::filesystem::path> list() const;
  // What `latest` names, if it exists and names a file in this folder.
  std::optional<std::filesystem::path> latest_pointer() const;
  // The order to try loading in: what `latest` names, then every file by step, newest first.
  std::vector<std::filesystem::path> load_candidates() const;
  // Temporary files whose writing process is gone: saves that were killed mid-write.
  std::vector<std::filesystem::path> debris() const;
  // Waits until the checkpoints the last commit let go are deleted. Every save waits
  // before it writes (check_free_space(), commit()), and so does the destructor. Not
  // while a commit into this object runs on another thread (a Checkpoint::save_async's:
  // wait for its handle first).
  void wait_for_removals() const;
  // Deletes debris() (returns how many files went), and the files earlier commits set
  // aside for deletion, but for this process's own (being deleted).
  std::size_t remove_debris() const;
  // Throws StorageError (ENOSPC) when the folder's file system has less space free
  // than the newest checkpoint took, once the last commit's deletions are done and
  // remove_debris() has run: a save that would fail part way fails before writing a
  // byte. A folder without checkpoints passes.
  void check_free_space() const;
  // Files set aside as damaged (quarantine()), by name.
  std::vector<std::filesystem::path> quarantined() const;
  // Renames a damaged checkpoint to <name>.damaged (or .damaged-2, ...), so that it is
  // never loaded or counted again and stays for a person to look at; returns the new path.
  std::filesystem::path quarantine(const std::filesystem::path& file) const;
  // Whether the folder shows that a run saved here: a checkpoint, a `latest`, or a
  // quarantined file. Resuming from such a folder never silently starts over.
  bool has_history() const;
  // Moves every checkpoint, `latest` and quarantined file into <dir>/superseded-<UTC
  // time>-<pid>/ (nothing is deleted), for a run that asked to start over here; returns
  // that folder, or an empty path when there was nothing to move.
  std::filesystem::path supersede() const;

  // The step in a checkpoint file name, or nullopt for any other name.
  static std::optional<std::int64_t> step_of(const std::filesystem::path& file);

 private:
  std::filesystem::path going_path(const std::filesystem::path& file) const;

  std::filesystem::path folder_;
  std::size_t keep_last_;
  // The last commit's deletions (std::async's: the last copy's destruction waits for them).
  std::shared_future<void> removal_;
};

}  // namespace troupe::checkpoint
