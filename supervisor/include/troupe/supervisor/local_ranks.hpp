// LocalRanks: the ranks of the job that run on this host, watched through pidfds.
//
// Stopping a job is over once every rank has exited; mpirun needs over a second after
// a signal to notice that (measured: ~1.2 s on Open MPI 4.1), so troupe-run watches
// the ranks of its own host itself -- a pidfd per rank, opened when the rank registers,
// readable when the process exits -- and signals them directly: Open MPI puts each
// local rank in a process group of its own, and a pidfd cannot name a reused pid.
// Ranks on other hosts are not watched; all_exited() is then never true, and a stop
// waits for mpirun's exit instead.
//
// Only troupe-run's io_context thread uses it; no locks.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <memory>
#include <vector>

#include "troupe/supervisor/heartbeat_server.hpp"

namespace troupe::supervisor {

class LocalRanks {
 public:
  explicit LocalRanks(boost::asio::io_context& io) : io_(io) {}

  // A launch of `np` ranks: the last launch's are forgotten.
  void begin_launch(int np);
  // Watches `rank` when it runs on this host; `exited` runs on the io_context's thread
  // once its process is gone.
  void watch(const RankStatus& rank, std::function<void()> exited);
  // `signal` to every watched rank still running.
  void signal(int signal);
  // True when every rank of the launch is watched and has exited.
  bool all_exited() const;

 private:
  struct Process {
    explicit Process(boost::asio::io_context& io) : fd(io) {}
    boost::asio::posix::stream_descriptor fd;
    bool exited = false;
  };
  boost::asio::io_context& io_;
  std::vector<std::shared_ptr<Process>> processes_;  // by rank; null when not watched
};

}  // namespace troupe::supervisor
