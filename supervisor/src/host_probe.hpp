// HostProbe: whether a host left out of the job answers again (troupe-run --regrow).
//
// Every `interval` it starts `mpirun --host H:1 -np 1 <the job's launcher options> true`
// (probe_command) on the next host of a round robin over the hosts it is asked about --
// through the job's own launcher, so ssh, an rsh agent or Slurm reach the host the way
// the job would. One probe runs at a time and is killed after max(10 s, interval): an
// unreachable host can keep ssh waiting. start(): the first host that answers is
// reported once, and probing stops until start() is called again. start_all(): every
// host given must answer, in order, each retried until it does (troupe-run --host-wait).
//
// Also here: newest_checkpoint_step(), what troupe-run waits for before growing back.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "job.hpp"
#include "run_options.hpp"

namespace troupe::supervisor {

class HostProbe {
 public:
  using Hosts = std::function<std::vector<std::string>()>;  // the hosts to probe now
  using Answered = std::function<void(const std::string& host)>;
  using Say = std::function<void(const std::string& line)>;

  HostProbe(boost::asio::io_context& io, RunOptions options, std::string mpirun, Say say);
  ~HostProbe();
  HostProbe(const HostProbe&) = delete;
  HostProbe& operator=(const HostProbe&) = delete;

  // Probes hosts() every interval until one answers; then calls `answered` and stops.
  // Restarting while probing keeps the probe in flight.
  void start(Hosts hosts, Answered answered);
  // Probes `hosts`, the first first, each until it answers; calls `all_answered` once
  // the last one has. failed() counts over all of them.
  void start_all(std::vector<std::string> hosts, std::function<void()> all_answered);
  // The hosts start_all() still waits for.
  const std::vector<std::string>& waiting() const { return waiting_; }
  // Stops probing; a probe in flight is killed.
  void stop();
  // Probes that did not answer since start().
  int failed() const { return failed_; }

 private:
  void schedule();
  void probe(const std::string& host);

  boost::asio::io_context& io_;
  RunOptions options_;
  std::string mpirun_;
  Say say_;
  boost::asio::steady_timer timer_, deadline_;
  Hosts hosts_;
  Answered answered_;
  std::vector<std::string> waiting_;    // start_all's hosts yet to answer
  std::function<void()> all_answered_;  // set: start_all's mode
  std::unique_ptr<Job> job_;
  bool active_ = false;
  int started_ = 0;  // probes so far: the round robin's position
  int failed_ = 0;
};

// The step of the newest checkpoint in `dir` ("ckpt-<step>.h5", which the checkpoint
// writer renames into place only once it is whole), or -1.
long long newest_checkpoint_step(const std::string& dir);

// Why a relaunch would fail its saves again, or "" when it would not: `dir`'s file
// system has less space free than its newest checkpoint took, counting as free what
// the dead job's unfinished saves and deletions left there.
std::string checkpoint_space_shortfall(const std::string& dir);

}  // namespace troupe::supervisor
