// Engine: the in-flight operations of one communicator, and whoever drives them.
//
// Operations start in call order (the sequence order every rank agrees on) and are
// then advanced by progress(), which polls each once without blocking. Three kinds of
// thread call it: a caller inside Work::wait (polling, because a thread wake-up costs
// more than a small collective), a caller inside Work::test, and the optional progress
// thread, which runs only while something is in flight and nobody is waiting (so async
// work overlaps computation) and parks on a condition variable otherwise.
//
// Failure is sticky: after a timeout or an error, every in-flight operation ends with
// CommunicatorFailed and new calls are refused. MPI cannot cancel a collective, so the
// abandoned operations are kept (never freed) in case MPI still writes to them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/collectives/operation.hpp"
#include "troupe/collectives/options.hpp"
#include "troupe/trace.hpp"

namespace troupe::collectives::detail {

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(Options options, int rank, int size);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();

  const Options& options() const { return options_; }

  // Starts `operation` on the calling thread and tracks it until it is done.
  // Throws (and tracks nothing) if start() throws.
  void launch(const std::shared_ptr<Operation>& operation, bool blocking);
  // Polls every in-flight operation once.
  void progress();
  // Nothing is in flight (so a blocking MPI call cannot overtake or starve one).
  bool idle() const;
  // Polls until `operation` and every operation launched before it are done, or
  // `timeout` passes; rethrows the operation's error.
  void wait(Operation& operation, std::chrono::milliseconds timeout);
  // Polls until every operation launched so far is done, or `timeout` passes (then
  // fails the communicator and throws TimeoutError, as wait does); rethrows the error
  // of the last one.
  void wait_all(std::chrono::milliseconds timeout);
  // Waits for everything in flight; false if the timeout passed first.
  bool drain(std::chrono::milliseconds timeout) noexcept;
  // Time callers spent in wait() on operations not yet done when they came to it: on a
  // healthy rank mostly waiting for slower peers. Only a wait that polls more than once
  // reads the clock, so a collective that is already done costs nothing extra.
  std::chrono::nanoseconds waited() const {
    return std::chrono::nanoseconds(waited_ns_.load(std::memory_order_relaxed));
  }
  // How many of those waits there were: the host blocked on an unfinished collective.
  std::uint64_t blocked_waits() const { return blocked_waits_.load(std::memory_order_relaxed); }

  // Spans of every operation launched while `tracer` records (on the track `track`)
  // and of every wait on one (on the waiting thread); null: none.
  void set_tracer(Tracer* tracer, std::string track);
  // The tracer is set and recording (the caller then reads the clock for a span).
  bool tracing() const {
    const Tracer* tracer = tracer_.load(std::memory_order_acquire);
    return tracer != nullptr && tracer->recording();
  }
  // A call that finished on the caller's thread, started at `begin_ns`, as a span.
  void record_finished_on_caller(const Collective& c, std::int64_t begin_ns);

  void fail(const std::string& reason);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() const;
  // Operations abandoned by a failure; a backend must not free what they use.
  bool has_abandoned() const;
  // Joins the progress thread. Backends call it before freeing what operations use.
  void stop();

 private:
  void progress_locked();
  // `operation` and everything launched before it are done.
  bool finished_locked(const Operation& operation) const;
  void finish(Operation& operation, std::exception_ptr error);
  void record_span_locked(const Collective& c, std::int64_t begin_ns);
  void fail_locked(const std::string& reason);
  void progress_loop();

  const Options options_;
  const int rank_;
  const int size_;

  mutable std::mutex mutex_;
  std::deque<std::shared_ptr<Operation>> in_flight_;  // in launch order
  // in_flight_.size(), readable without the lock: wait_all returns at once when it is 0
  // (a blocking call's fast path, which otherwise paid a lock for nothing).
  std::atomic<std::size_t> in_flight_count_{0};
  std::uint64_t launches_ = 0;
  std::vector<std::shared_ptr<Operation>> abandoned_;
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::atomic<std::int64_t> waited_ns_{0};
  std::atomic<std::uint64_t> blocked_waits_{0};
  std::atomic<Tracer*> tracer_{nullptr};
  std::string track_;  // under mutex_

  std::atomic<int> waiters_{0};
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread progress_thread_;
};

}  // namespace troupe::collectives::detail
