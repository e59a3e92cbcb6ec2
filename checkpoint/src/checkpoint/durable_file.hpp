// The POSIX steps that make a file survive a crash: fsync the file so its bytes are on
// disk, rename it into place (atomic within one directory), then fsync the directory so
// the rename itself is on disk. Every failure names the path and errno's text.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace troupe::checkpoint::detail {

// An open file descriptor, closed on destruction; every failure names the path.
class PosixFile {
 public:
  PosixFile(const std::filesystem::path& path, int flags, mode_t mode = 0644);
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;
  ~PosixFile();
  int get() const { return fd_; }
  // pwrite(2) of all `bytes`, however many calls it takes.
  void write_at(std::int64_t offset, const void* data, std::size_t bytes);
  void sync();   // fsync(2)
  void close();  // close(2), reporting its error (the destructor cannot)

 private:
  std::filesystem::path path_;
  int fd_;
};

void fsync_path(const std::filesystem::path& path);  // a file or a directory
// rename(2) from -> to, then fsync to's directory.
void durable_rename(const std::filesystem::path& from, const std::filesystem::path& to);
// Replaces `path` with `text`, never leaving it half written: temp file, fsync, rename.
void write_text_durably(const std::filesystem::path& path, const std::string& text);

}  // namespace troupe::checkpoint::detail
