// Work: the handle an asynchronous collective returns (c10d's Work, gloo's wait rules).
//
//   test()          drives progress once and says whether the collective has finished,
//                   successfully or not; it never blocks and never throws.
//   wait(timeout)   drives progress until the collective, and every collective started
//                   before it on the same communicator, has finished; then rethrows
//                   its error if it failed. When `timeout` passes first it throws
//                   TimeoutError naming the collective, its sequence number, its size
//                   and the peer not heard from when known, and fails the communicator
//                   so that every later call fails fast instead of hanging.
//   wait()          the same with the communicator's Options::timeout.
//   wait_on_device()  for a collective on a CUDA stream (NCCL): makes the stream
//                   troupe's kernels run on wait for it, and returns at once, as
//                   PyTorch's work.wait() does for NCCL -- the host goes on queueing
//                   work (the optimizer step) that the GPU runs after the collective.
//                   Returns false, doing nothing, for a host collective (MPI, shared
//                   memory): wait() it. Errors then surface at a later wait or call.
//
// Waiting polls MPI (or CUDA) on the waiting thread, no sleeping: a thread wake-up costs
// more than a small collective.
//
// A handle dropped before completion does not cancel the collective and does not
// terminate the process: the collective keeps running and completes when anyone drives
// the communicator's progress — another wait, the progress thread, or the
// communicator's destructor (which waits for everything in flight, up to its timeout).
// Its buffers must stay alive until then: until the wait() of a collective started
// after it returns, or the communicator is destroyed. If a dropped collective fails, the
// communicator is marked failed and the next call reports why.
//
// Copies share the same collective. A default-constructed Work is already complete.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

namespace troupe::collectives {

class Operation;

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<Operation> operation) : operation_(std::move(operation)) {}

  bool test();
  bool is_completed() const;
  // Completed without error.
  bool is_success() const;
  // The error the collective failed with, or null.
  std::exception_ptr exception() const;

  void wait();
  void wait(std::chrono::milliseconds timeout);
  // See above: true when nothing is left for the host to wait for (the device waits, or
  // the collective is already done; its error, if any, is rethrown).
  bool wait_on_device();

  // The collective's sequence number on its communicator (0 for a default Work).
  std::uint64_t sequence() const;
  // "allreduce #12 (sum, 1023 x bf16 = 2046 B)"
  std::string describe() const;

 private:
  friend class Communicator;  // its flight recorder watches operations without keeping them
  std::shared_ptr<Operation> operation_;
};

}  // namespace troupe::collectives
