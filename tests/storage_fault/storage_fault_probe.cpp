// The child storage_fault_test runs under libtroupe_iofault.so: it performs the file
// calls its arguments list, in order, on one current descriptor, and prints one line
// per call, "<call> -> <result> in <ms> ms", the result being the byte count or 0, or
// errno's name. It never stops at an error: the test reads what each call saw.
//
//   cd DIR | open PATH (write, create) | openr PATH | write N | writev N | read N |
//   fsync | dup | close | rename FROM TO | unlink PATH |
//   ofstream PATH N | ifstream PATH | fs_rename FROM TO | fs_remove PATH
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

int fd = -1;

std::string outcome(long result) { return result >= 0 ? std::to_string(result) : std::string(strerrorname_np(errno)); }

// Runs the call at argv[i] and returns how many arguments it took.
int run(int argc, char** argv, int i, std::string& line) {
  const std::string call = argv[i];
  auto arg = [&](int k) -> const char* {
    if (i + k >= argc) {
      std::fprintf(stderr, "storage_fault_probe: '%s' needs %d argument(s)\n", argv[i], k);
      std::exit(2);
    }
    return argv[i + k];
  };
  auto bytes = [&](int k) { return static_cast<std::size_t>(std::stoul(arg(k))); };
  std::vector<char> buffer;
  if (call == "cd") return line = outcome(chdir(arg(1))), 2;
  if (call == "open") return line = outcome(fd = open(arg(1), O_WRONLY | O_CREAT | O_TRUNC, 0644)), 2;
  if (call == "openr") return line = outcome(fd = open(arg(1), O_RDONLY)), 2;
  if (call == "write") {
    buffer.assign(bytes(1), 'x');
    return line = outcome(write(fd, buffer.data(), buffer.size())), 2;
  }
  if (call == "writev") {  // two buffers, so a short transfer must cut across them
    buffer.assign(bytes(1), 'v');
    iovec parts[2] = {{buffer.data(), buffer.size() / 2},
                      {buffer.data() + buffer.size() / 2, buffer.size() - buffer.size() / 2}};
    return line = outcome(writev(fd, parts, 2)), 2;
  }
  if (call == "read") {
    buffer.resize(bytes(1));
    return line = outcome(read(fd, buffer.data(), buffer.size())), 2;
  }
  if (call == "fsync") return line = outcome(fsync(fd)), 1;
  if (call == "dup") return line = outcome(fd = dup(fd)), 1;
  if (call == "close") return line = outcome(close(fd)), 1;
  if (call == "rename") return line = outcome(rename(arg(1), arg(2))), 3;
  if (call == "unlink") return line = outcome(unlink(arg(1))), 2;
  if (call == "ofstream") {
    std::ofstream out(arg(1), std::ios::binary | std::ios::trunc);
    out << std::string(bytes(2), 'o');
    out.close();
    return line = out.fail() ? "failed" : "ok", 3;
  }
  if (call == "ifstream") {
    std::ifstream in(arg(1), std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return line = in.bad() || !in.is_open() ? "failed" : std::to_string(text.size()), 2;
  }
  std::error_code ec;
  if (call == "fs_rename") {
    std::filesystem::rename(arg(1), arg(2), ec);
    return line = ec ? ec.message() : "0", 3;
  }
  if (call == "fs_remove") {
    std::filesystem::remove(arg(1), ec);
    return line = ec ? ec.message() : "0", 2;
  }
  std::fprintf(stderr, "storage_fault_probe: unknown call '%s'\n", argv[i]);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc;) {
    std::string line;
    auto start = std::chrono::steady_clock::now();
    int used = run(argc, argv, i, line);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s -> %s in %lld ms\n", argv[i], line.c_str(), static_cast<long long>(ms));
    i += used;
  }
  return 0;
}
