#include "troupe/supervisor/rank_dump.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

extern char** environ;

namespace troupe::supervisor {

namespace fs = std::filesystem;

std::string dump_folder(const std::string& checkpoint_dir) { return checkpoint_dir + "/troupe-run-dumps"; }

std::string dump_path(const std::string& checkpoint_dir, int rank) {
  return dump_folder(checkpoint_dir) + "/rank-" + std::to_string(rank) + ".txt";
}

std::string crash_dump_path(const std::string& checkpoint_dir, int rank) {
  return dump_folder(checkpoint_dir) + "/crash-rank-" + std::to_string(rank) + ".txt";
}

namespace {

// Runs `argv` with stdout and stderr appended to `path`; kills it after `timeout`.
// The tracer is held back until this thread is past posix_spawn: `argv` runs through
// `sh`, which execs it only once it reads a line this thread writes after the spawn
// returns. Otherwise a tracer that starts fast (eu-stack) can stop this thread right
// after its clone3 syscall, where glibc's unwind tables end the stack, and the dump
// loses the frames it is for: the crashing thread's.
std::string run_into(const std::vector<std::string>& argv, const std::string& path, std::chrono::milliseconds timeout) {
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) return std::string("pipe: ") + std::strerror(errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, go[0], 0);
  posix_spawn_file_actions_addopen(&actions, 1, path.c_str(), O_WRONLY | O_APPEND, 0);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<std::string> shell = {"/bin/sh", "-c", "read -r _; exec \"$0\" \"$@\" </dev/null"};
  shell.insert(shell.end(), argv.begin(), argv.end());
  std::vector<char*> args;
  for (const auto& a : shell) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t child = -1;
  const int error = posix_spawn(&child, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(go[0]);
  if (error == 0) {
    [[maybe_unused]] const ssize_t written = ::write(go[1], "\n", 1);
  }
  ::close(go[1]);
  if (error != 0) return argv[0] + ": " + std::strerror(error);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return argv[0] + " took longer than " + std::to_string(timeout.count()) + " ms; stopped";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return argv[0] + ": not found or not runnable";
  return {};
}

bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (std::size_t start = 0; start <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    if (::access((dirs.substr(start, end - start) + "/" + name).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

std::string write_rank_dump(const std::string& path, const std::string& header, const std::vector<std::string>& flight,
                            std::chrono::milliseconds stack_timeout) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    if (!out) return "cannot write " + partial + ": " + std::strerror(errno);
    out << header << "\n== collectives (oldest first; the flight recorder) ==\n";
    if (flight.empty()) out << "(none recorded)\n";
    for (const auto& line : flight) out << line << "\n";
    out << "== threads ==\n";
  }
  // A process may be traced by its own child only where Yama allows it; as root, or
  // with ptrace_scope 0, this is not needed.
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  const std::string pid = std::to_string(::getpid());
  std::string problem;
  if (on_path("eu-stack"))
    problem = run_into({"eu-stack", "-p", pid}, partial, stack_timeout);
  else if (on_path("gdb"))
    problem = run_into({"gdb", "-batch", "-nx", "-p", pid, "-ex", "thread apply all bt"}, partial, stack_timeout);
  else
    problem = "neither eu-stack (elfutils) nor gdb is installed: no stacks";
  if (!problem.empty()) std::ofstream(partial, std::ios::app) << "(" << problem << ")\n";
  fs::rename(partial, path, ec);
  if (ec) return "cannot rename " + partial + ": " + ec.message();
  return problem;
}

}  // namespace troupe::supervisor
