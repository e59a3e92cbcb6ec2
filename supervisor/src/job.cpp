#include "job.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
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

namespace {

// What the child does between fork and exec: only async-signal-safe calls, as
// troupe-run may have other threads. Reports a failure as its errno on `report`.
[[noreturn]] void become_job(char** argv, char** envp, pid_t parent, int report) {
  ::setpgid(0, 0);  // a group of its own, led by mpirun
  // Asio's signal_set handlers are reset by exec; SIGPIPE ignored and the mask are not.
  struct sigaction defaults {};
  defaults.sa_handler = SIG_DFL;
  for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP}) ::sigaction(s, &defaults, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
#ifdef SYS_close_range
  // Asio opens sockets without close-on-exec: mpirun must not hold troupe-run's
  // listening socket or its ranks' connections open (4: CLOSE_RANGE_CLOEXEC; a kernel
  // before 5.11 refuses it, and the job inherits them as it always did).
  ::syscall(SYS_close_range, 3u, ~0u, 4u);
#endif
  // When troupe-run dies, even by SIGKILL, mpirun gets SIGTERM: it then ends the ranks
  // and its remote daemons in order (a SIGKILLed mpirun leaves that to each rank's
  // fencing). If troupe-run died before this line, the signal will never come: check.
  if (::prctl(PR_SET_PDEATHSIG, kParentDeathSignal) == 0) {
    if (::getppid() != parent) ::_exit(127);  // no one is left to read a report
    ::execve(argv[0], argv, envp);
  }
  int err = errno;
  [[maybe_unused]] auto n = ::write(report, &err, sizeof err);
  ::_exit(127);
}

// fork + exec of argv, so that the child can ask for a parent-death signal (posix_spawn
// cannot). Throws naming the program when it cannot be started; then nothing is left.
pid_t start_child(char** argv, char** envp) {
  int report[2];  // close-on-exec: the parent reads EOF once exec succeeded
  if (::pipe2(report, O_CLOEXEC) != 0)
    TROUPE_THROW(Error, "troupe-run: cannot start ", argv[0], ": pipe2: ", std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) become_job(argv, envp, parent, report[1]);
  const int fork_errno = errno;
  ::close(report[1]);
  if (pid < 0) {
    ::close(report[0]);
    TROUPE_THROW(Error, "troupe-run: cannot start ", argv[0], ": fork: ", std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before a signal
  int child_errno = 0;
  ssize_t got;
  do got = ::read(report[0], &child_errno, sizeof child_errno);
  while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got > 0) {
    ::waitpid(pid, nullptr, 0);
    TROUPE_THROW(Error, "troupe-run: cannot start ", argv[0], ": ", std::strerror(child_errno));
  }
  return pid;
}

}  // namespace

Job::Job(boost::asio::io_context& io, const std::vector<std::string>& argv, const Environment& extra) : pidfd_(io) {
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

  pid_ = start_child(args.data(), envp.data());

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
