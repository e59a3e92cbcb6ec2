// A small file system of its own, for tests of a full disk: a tmpfs of `bytes`, mounted
// at `at` and unmounted at the end. Needs CAP_SYS_ADMIN (CI runs as root); a test
// skips where mounted() is false.
#pragma once

#include <sys/mount.h>

#include <cstddef>
#include <filesystem>
#include <string>

namespace troupe::test_support {

class SmallDisk {
 public:
  SmallDisk(const std::filesystem::path& at, std::size_t bytes) : at_(at) {
    std::filesystem::create_directories(at);
    const std::string options = "size=" + std::to_string(bytes);
    mounted_ = ::mount("tmpfs", at.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(at_.c_str(), MNT_DETACH);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  bool mounted() const { return mounted_; }

 private:
  std::filesystem::path at_;
  bool mounted_ = false;
};

}  // namespace troupe::test_support
