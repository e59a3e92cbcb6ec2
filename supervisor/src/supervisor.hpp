// Supervisor: troupe-run's restart loop.
//
//   launch mpirun ──> watch ──(all ranks done, mpirun exit 0)──> finish, exit 0
//        ^              │ failure: a rank's connection closed without goodbye,
//        │              │ mpirun exited non-zero, heartbeats stopped, no progress
//        │              v
//   backoff <── stop the job (SIGTERM to its process group, SIGKILL after --grace)
//                       │ after --max-restarts relaunches: give up, exit 1
//
// Everything runs on one thread in one Asio io_context: the heartbeat server, the
// pidfd that reports mpirun's exit, the watchdog tick, the timers and SIGINT/SIGTERM/
// SIGHUP (each stops the job; a kill -9 reaches mpirun as its parent-death signal,
// job.hpp).
// So the state below needs no locks, and a failure noticed twice (a rank's socket
// closing and then mpirun exiting) is handled once: only the first, while the job
// runs, counts.
//
// A dead rank is noticed when its socket closes (the kernel closes it as the process
// dies, well before mpirun notices); a hang when any rank's progress (step, collective)
// stands still for --hang-timeout, reported with every rank's step and collective so
// the one that is behind shows; a stopped rank when its heartbeats stop for
// --heartbeat-timeout.
#pragma once

#include <memory>

#include "run_options.hpp"

namespace troupe::supervisor {

class Supervisor {
 public:
  // Checks what can be checked before anything starts: mpirun on PATH, the
  // checkpoint directory, the events file, the bind address. Throws troupe::Error.
  explicit Supervisor(RunOptions options);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Runs the job to its end and returns troupe-run's exit status (see usage()).
  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::supervisor
