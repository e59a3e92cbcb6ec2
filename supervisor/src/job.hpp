// Job: one launch of mpirun, in a process group of its own, watched from an Asio loop.
//
// A process group, so that stopping the job reaches mpirun and every rank it forked
// on this node with one kill(-pgid) (and a terminal's Ctrl-C reaches only troupe-run,
// which then stops the job in order). The exit is observed through a pidfd, which an
// Asio descriptor can wait on without a SIGCHLD handler.
//
// mpirun is started with a parent-death signal (kParentDeathSignal), so that troupe-run
// dying -- kill -9 included, which no handler sees -- ends mpirun and, through it, the
// ranks, instead of leaving a job no one supervises. The signal follows the *thread*
// that started the Job: create Jobs on a thread that lives as long as they do
// (troupe-run's io_context thread, its main thread).
#pragma once

#include <sys/types.h>

#include <csignal>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::supervisor {

// What mpirun gets when troupe-run dies. SIGTERM, not SIGKILL: mpirun passes it to the
// ranks and to its daemons on other hosts and cleans up its session directory; a
// SIGKILLed mpirun leaves its ranks running until their fencing notices that
// troupe-run is gone (client.hpp), which ranks that never registered do not have.
inline constexpr int kParentDeathSignal = SIGTERM;

// The absolute path of `name` on PATH; throws troupe::Error naming PATH when absent.
std::string find_on_path(const std::string& name);

// "exited with status 1", "killed by signal 9 (Killed)".
std::string describe_wait_status(int status);

class Job {
 public:
  using Environment = std::vector<std::pair<std::string, std::string>>;

  // Starts `argv` (argv[0] an absolute path) with troupe-run's environment plus
  // `extra` (replacing variables of the same name). Throws troupe::Error on failure.
  Job(boost::asio::io_context& io, const std::vector<std::string>& argv, const Environment& extra);
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  // Kills the group and reaps mpirun if it is still running (never leaves a zombie).
  ~Job();

  pid_t pid() const { return pid_; }
  bool running() const { return !exited_; }
  // Calls `on_exit(wait_status)` once, from the io_context, when mpirun exits.
  void on_exit(std::function<void(int)> on_exit);
  // Sends `signal` to mpirun's process group (mpirun and the ranks on this node).
  void signal_group(int signal) const;

 private:
  void watch();
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  boost::asio::posix::stream_descriptor pidfd_;
  std::function<void(int)> on_exit_;
};

}  // namespace troupe::supervisor
