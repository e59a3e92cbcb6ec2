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
// A pid comes from the rank's Hello, which anyone holding the run's token can write;
// troupe-run must not become a way to signal an arbitrary process of this host. So a
// rank counts as local only when it says this host's name, its connection comes from
// an address of this host (loopback or an interface's), and its pid is a descendant
// of this launch's mpirun -- checked through /proc after its pidfd is open, and the
// process found still alive after the check, so the pid checked is the one watched.
// Anything else is not signalled (watch() says why); a stop then waits for mpirun,
// as for a remote rank.
//
// Only troupe-run's io_context thread uses it; no locks.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "heartbeat_server.hpp"

namespace troupe::supervisor {

class LocalRanks {
 public:
  explicit LocalRanks(boost::asio::io_context& io) : io_(io) {}

  // A launch of `np` ranks started by the mpirun of pid `launcher`: the last launch's
  // ranks are forgotten.
  void begin_launch(int np, pid_t launcher);
  // Watches `rank` when it runs on this host; `exited` runs on the io_context's thread
  // once its process is gone. Returns "" when the rank is watched or runs on another
  // host; why not, when it named this host but failed a check above.
  std::string watch(const RankStatus& rank, std::function<void()> exited);
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
  pid_t launcher_ = -1;
  std::vector<std::shared_ptr<Process>> processes_;  // by rank; null when not watched
};

// Whether `pid` descends from `ancestor` (its parent, or its parent's parent, ...),
// read from /proc/<pid>/stat; false once the chain reaches init or a process is gone.
bool descends_from(pid_t pid, pid_t ancestor);

// Whether `address` belongs to this machine: loopback, or an interface's (getifaddrs).
bool is_local_address(const boost::asio::ip::address& address);

}  // namespace troupe::supervisor
