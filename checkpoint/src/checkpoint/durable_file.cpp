#include "durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "troupe/checkpoint/error.hpp"

namespace troupe::checkpoint::detail {

namespace fs = std::filesystem;

namespace {
[[noreturn]] void os_fail(const char* call, const fs::path& path, int err) { throw_os_error(call, path.string(), err); }

}  // namespace

PosixFile::PosixFile(const fs::path& path, int flags, mode_t mode) : path_(path) {
  fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd_ < 0) os_fail("open", path, errno);
}

PosixFile::~PosixFile() {
  if (fd_ >= 0) ::close(fd_);
}

void PosixFile::write_at(std::int64_t offset, const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) os_fail("pwrite", path_.string() + " at byte " + std::to_string(offset), errno);
    p += n;
    offset += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void PosixFile::sync() {
  if (::fsync(fd_) != 0) os_fail("fsync", path_, errno);
}

void PosixFile::close() {
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) os_fail("close", path_, errno);
}

void fsync_path(const fs::path& path) {
  PosixFile fd(path, O_RDONLY);
  fd.sync();
  fd.close();
}

void durable_rename(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) os_fail("rename", from.string() + " -> " + to.string(), errno);
  fs::path dir = to.parent_path();
  fsync_path(dir.empty() ? fs::path(".") : dir);
}

void write_text_durably(const fs::path& path, const std::string& text) {
  fs::path temp = path;
  temp += ".tmp-" + std::to_string(::getpid());
  {
    PosixFile fd(temp, O_WRONLY | O_CREAT | O_TRUNC);
    fd.write_at(0, text.data(), text.size());
    fd.sync();
    fd.close();
  }
  durable_rename(temp, path);
}

}  // namespace troupe::checkpoint::detail
