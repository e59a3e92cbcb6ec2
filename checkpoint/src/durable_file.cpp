#include "durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "troupe/checkpoint/error.hpp"

namespace troupe::checkpoint::detail {

namespace fs = std::filesystem;

namespace {
[[noreturn]] void os_fail(const char* call, const fs::path& path, int err) {
  TROUPE_THROW(CheckpointError, "checkpoint: ", call, "(", path.string(), ") failed: ",
               std::strerror(err));
}

class Fd {
 public:
  Fd(const fs::path& path, int flags, mode_t mode = 0644) : path_(path) {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd_ < 0) os_fail("open", path, errno);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  void close() {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) os_fail("close", path_, errno);
  }

 private:
  fs::path path_;
  int fd_;
};
}  // namespace

void fsync_path(const fs::path& path) {
  Fd fd(path, O_RDONLY);
  if (::fsync(fd.get()) != 0) os_fail("fsync", path, errno);
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
    Fd fd(temp, O_WRONLY | O_CREAT | O_TRUNC);
    const char* p = text.data();
    std::size_t left = text.size();
    while (left > 0) {
      ssize_t n = ::write(fd.get(), p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) os_fail("write", temp, errno);
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) os_fail("fsync", temp, errno);
    fd.close();
  }
  durable_rename(temp, path);
}

}  // namespace troupe::checkpoint::detail
