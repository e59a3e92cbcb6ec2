#include "troupe/supervisor/job.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "troupe/error.hpp"

extern char** environ;

namespace troupe::supervisor {

std::string find_on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  TROUPE_THROW(Error, "troupe-run: '", name, "' not found on PATH (", dirs, ")");
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + ::strsignal(WTERMSIG(status)) + ")";
  return "ended with wait status " + std::to_string(status);
}

Job::Job(boost::asio::io_context& io, const std::vector<std::string>& argv, const Environment& extra)
    : pidfd_(io) {
  TROUPE_CHECK(!argv.empty(), "Job: empty command");
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [name, value] : extra) env[name] = value;
  std::vector<std::string> env_strings;
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);  // a group of its own, led by mpirun
  // troupe-run's Asio handlers block nothing, but reset what it may have changed.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  int rc = ::posix_spawn(&pid_, args[0], nullptr, &attr, args.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0) TROUPE_THROW(Error, "troupe-run: cannot start ", argv[0], ": ", std::strerror(rc));

  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (fd < 0) {
    int err = errno;
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    TROUPE_THROW(Error, "troupe-run: pidfd_open(", pid_, ") failed: ", std::strerror(err));
  }
  pidfd_.assign(fd);
  watch();
}

Job::~Job() {
  if (!exited_) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  boost::system::error_code ignored;
  pidfd_.close(ignored);
}

void Job::on_exit(std::function<void(int)> on_exit) { on_exit_ = std::move(on_exit); }

void Job::signal_group(int signal) const {
  // The group outlives mpirun when a rank ignores the signal; kill(-pgid) still reaches it.
  ::kill(-pid_, signal);
}

void Job::watch() {
  pidfd_.async_wait(boost::asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
    if (ec) return;  // closed: the Job is being destroyed
    int status = 0;
    pid_t got = ::waitpid(pid_, &status, WNOHANG);
    if (got == 0) {
      watch();
      return;
    }
    exited_ = true;
    status_ = status;
    // The callback may destroy this Job: call it from a local, touch no member after.
    auto on_exit = std::move(on_exit_);
    if (on_exit) on_exit(status);
  });
}

}  // namespace troupe::supervisor
