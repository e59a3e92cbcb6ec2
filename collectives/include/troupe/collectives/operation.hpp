// Operation: one collective in flight, as a small state machine a backend implements
// (gloo's Algorithm, made non-blocking). The engine calls start() once, on the caller's
// thread and in sequence order, then progress() until it returns true; progress() never
// blocks, so one thread can drive many operations and time out cleanly.
//
// Threads: start() and progress() are called with the communicator's engine lock held,
// so an operation needs no locking of its own. Whatever they throw becomes the error
// that Work::wait() rethrows.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "troupe/collectives/collective.hpp"

namespace troupe::collectives {

namespace detail {
class Engine;
}

class Operation {
 public:
  explicit Operation(Collective collective) : collective_(std::move(collective)) {}
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;
  virtual ~Operation() = default;

  const Collective& collective() const { return collective_; }

  // Posts the first messages (or MPI requests, or stream work).
  virtual void start() = 0;
  // Advances without blocking; true once the result is in the output buffer.
  virtual bool progress() = 0;
  // Makes the CUDA stream troupe's kernels run on (the legacy default stream) wait for
  // this operation's device work, without blocking the host; false when it has none (a
  // host collective), so the caller must wait on the host. Called after start().
  virtual bool queue_device_wait() { return false; }
  // Who this operation is waiting for, for timeout messages ("rank 3"); empty if unknown.
  virtual std::string waiting_on() const { return {}; }

  bool done() const { return done_.load(std::memory_order_acquire); }
  std::exception_ptr error() const { return done() ? error_ : nullptr; }

 private:
  friend class detail::Engine;
  friend class Work;

  Collective collective_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;                // written before done_ is set
  std::shared_ptr<detail::Engine> engine_;  // null for work that completed at once
  std::uint64_t launch_index_ = 0;          // order of launch on the engine
  std::int64_t traced_begin_ns_ = 0;        // when it launched, if the engine's tracer was recording
};

}  // namespace troupe::collectives
