// Future<T>: the answer to an ask, resolved exactly once, with a value or an error.
//
// Waiting drives progress. A thread in get() first polls the runtime's MPI
// transport itself (receiving and dispatching messages) for a short spin budget,
// unless another waiter already polls,
// because on these machines waking a blocked thread costs 5-25 us while an MPI
// round trip costs well under one; only then does it block on a condition variable
// that the resolving thread signals. While a waiter polls, the runtime's progress
// thread stands aside, so no more threads spin than there are waiters.
//
// get() moves the value out (call it once, like std::future); ready() and wait_for()
// may be called any number of times. A Future dropped before it resolves is fine:
// the answer, when it comes, is discarded. Continuations (then, when_all, when_any)
// run on whichever thread resolves the input -- keep them short.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::actors {

using Clock = std::chrono::steady_clock;

// When an ask must have started by: `ref.ask(Deadline::in(50ms), &T::method, args...)`.
// The callee does not start a call past its deadline (it fails with
// DeadlineExceeded), a running method sees it in this_call::cancelled(), and a
// caller waiting in get() stops waiting at the deadline and cancels the call.
struct Deadline {
  Clock::time_point at;
  template <class Rep, class Period>
  static Deadline in(std::chrono::duration<Rep, Period> timeout) {
    return {Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout)};
  }
};

namespace detail {

class StateBase;

// Which call a future answers, so that it can be cancelled; `canceller` (the
// runtime) sends the cancellation on its way.
struct CallHandle;
class CallCanceller {
 public:
  virtual ~CallCanceller() = default;
  virtual void cancel_call(const CallHandle& call, StateBase& state) = 0;
};
struct CallHandle {
  CallCanceller* canceller = nullptr;
  int rank = -1;
  std::uint64_t actor = 0;
  std::uint64_t request = 0;
  bool collective = false;  // listed in troupe_collective: cancel() refuses
};

// What a waiting thread can do instead of sleeping; implemented by the runtime.
class Progress {
 public:
  virtual ~Progress() = default;
  // Receives and dispatches at most a few ready messages, and with `run_local_calls`
  // also runs one ready actor call of this rank; false if nothing was ready. A
  // waiter with a timeout must not run actor calls (one could outlast its deadline).
  virtual bool progress_once(bool run_local_calls) = 0;
  // Brackets a waiter's polling phase, so that the progress thread does not spin too.
  // Only one thread polls at a time (it delivers every answer, not just its own);
  // try_begin_polling() is false when another already does.
  virtual bool try_begin_polling() = 0;
  virtual void end_polling() = 0;
  // Whether a send of this thread woke a sleeping thread of this node since the last
  // call: its answer then comes from a thread that may have been put on this core.
  virtual bool take_woke_sleeper() = 0;
  // True on the thread that receives when nobody else does: it must never block.
  virtual bool is_progress_thread() const = 0;
  // Brackets a waiter's blocking phase, so that the progress thread stays responsive.
  virtual void begin_blocking() = 0;
  virtual void end_blocking() = 0;
};

// How long a waiter polls before it blocks. Long enough to cover a round trip
// across ranks on shared memory or TCP, short enough that a long wait costs no CPU.
inline constexpr std::chrono::microseconds kPollBudget{200};

class StateBase {
 public:
  explicit StateBase(Progress* progress, std::string what) : progress_(progress), what_(std::move(what)) {}
  virtual ~StateBase() = default;

  bool ready() const { return ready_.load(std::memory_order_acquire); }
  void set_error(std::exception_ptr error);
  // Runs `callback` once the state is resolved (at once if it already is).
  void on_ready(std::function<void()> callback);
  // Waits until resolved or `deadline`; returns ready().
  bool wait_until(std::optional<Clock::time_point> deadline);
  // Throws the stored error, if any.
  void rethrow_if_error() const;
  // Makes this the answer of an ask that cancel() can reach, with the ask's deadline.
  // Set by the asker before it hands the future out.
  void set_call(const CallHandle& call, std::optional<Clock::time_point> deadline) {
    call_ = call;
    call_deadline_ = deadline;
  }
  // For futures derived from others (then, when_all): what cancel() does instead.
  void set_cancel_forward(std::function<void()> forward) { cancel_forward_ = std::move(forward); }
  // Asks for the call to be cancelled (see Future::cancel).
  void cancel();
  std::exception_ptr error() const { return error_; }
  Progress* progress() const { return progress_; }
  const std::string& what() const { return what_; }

 protected:
  // Publishes the result, wakes waiters and runs callbacks (outside the lock).
  void finish(std::unique_lock<std::mutex> lock);
  std::mutex mutex_;

 private:
  std::condition_variable cv_;
  std::atomic<bool> ready_{false};
  // The ask's deadline passed while a caller waited: fail it here and cancel it there.
  void expire();
  bool wait_until_impl(std::optional<Clock::time_point> deadline);

  std::exception_ptr error_;
  std::vector<std::function<void()>> callbacks_;
  Progress* progress_;
  std::string what_;
  CallHandle call_;
  std::optional<Clock::time_point> call_deadline_;
  std::function<void()> cancel_forward_;
};

template <class T>
class State : public StateBase {
 public:
  using StateBase::StateBase;
  void set_value(T value) {
    std::unique_lock lock(mutex_);
    if (ready()) return;
    value_.emplace(std::move(value));
    finish(std::move(lock));
  }
  T take() {
    rethrow_if_error();
    std::lock_guard lock(mutex_);
    if (!value_) TROUPE_THROW(InvalidArgument, "Future::get: the value of '", what(), "' was already taken");
    T v = std::move(*value_);
    value_.reset();
    return v;
  }

 private:
  std::optional<T> value_;
};

template <>
class State<void> : public StateBase {
 public:
  using StateBase::StateBase;
  void set_value() {
    std::unique_lock lock(mutex_);
    if (ready()) return;
    finish(std::move(lock));
  }
  void take() { rethrow_if_error(); }
};

template <class F, class T>
struct ThenResult {
  using type = std::invoke_result_t<F, T>;
};
template <class F>
struct ThenResult<F, void> {
  using type = std::invoke_result_t<F>;
};
template <class F, class T>
using then_result_t = typename ThenResult<F, T>::type;

}  // namespace detail

template <class T>
class Future {
 public:
  using value_type = T;
  Future() = default;
  explicit Future(std::shared_ptr<detail::State<T>> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  bool ready() const { return check().ready(); }
  // Waits until resolved; returns the value or throws its error.
  T get() {
    check().wait_until(std::nullopt);
    return state_->take();
  }
  // As get(), but throws TimeoutError naming the operation once `timeout` has passed.
  template <class Rep, class Period>
  T get(std::chrono::duration<Rep, Period> timeout) {
    if (!wait_for(timeout))
      TROUPE_THROW(TimeoutError, "'", state_->what(), "' did not answer within ",
                   std::chrono::duration<double>(timeout).count(), " s");
    return state_->take();
  }
  template <class Rep, class Period>
  bool wait_for(std::chrono::duration<Rep, Period> timeout) const {
    return check().wait_until(Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout));
  }
  // Asks the callee to cancel the call; returns at once. The future then resolves as
  // the call ends: with Cancelled if it had not started (it never will) or if the
  // running method gave up (this_call::throw_if_cancelled), else with its answer --
  // the work was done. No effect once resolved. A future from then() or when_all()
  // cancels its inputs. Throws InvalidArgument for a method listed in
  // troupe_collective (a collective cannot be abandoned on one rank), or for a
  // future that answers no ask (a Promise's).
  void cancel() const { check().cancel(); }
  // A future of f(value); an error in this future, or thrown by f, passes through.
  template <class F>
  auto then(F f) -> Future<detail::then_result_t<F, T>>;

  const std::shared_ptr<detail::State<T>>& state() const { return state_; }

 private:
  detail::State<T>& check() const {
    TROUPE_CHECK(state_ != nullptr, "Future: this future is empty (default-constructed or moved from)");
    return *state_;
  }
  std::shared_ptr<detail::State<T>> state_;
};

// The producing side of a Future, for code that resolves one by hand.
template <class T>
class Promise {
 public:
  explicit Promise(std::string what = "promise", detail::Progress* progress = nullptr)
      : state_(std::make_shared<detail::State<T>>(progress, std::move(what))) {}
  Future<T> get_future() const { return Future<T>(state_); }
  template <class... V>
  void set_value(V&&... v) {
    state_->set_value(std::forward<V>(v)...);
  }
  void set_error(std::exception_ptr e) { state_->set_error(std::move(e)); }
  const std::shared_ptr<detail::State<T>>& state() const { return state_; }

 private:
  std::shared_ptr<detail::State<T>> state_;
};

namespace detail {
// Calls f with the value of `in` (or with nothing for void) and stores the result in `out`.
template <class T, class R, class F>
void chain(State<T>& in, State<R>& out, F& f) {
  try {
    if constexpr (std::is_void_v<T>) {
      in.take();
      if constexpr (std::is_void_v<R>) {
        f();
        out.set_value();
      } else {
        out.set_value(f());
      }
    } else {
      if constexpr (std::is_void_v<R>) {
        f(in.take());
        out.set_value();
      } else {
        out.set_value(f(in.take()));
      }
    }
  } catch (...) {
    out.set_error(std::current_exception());
  }
}
}  // namespace detail

template <class T>
template <class F>
auto Future<T>::then(F f) -> Future<detail::then_result_t<F, T>> {
  using R = detail::then_result_t<F, T>;
  auto in = state_;
  auto out = std::make_shared<detail::State<R>>(check().progress(), in->what() + " then");
  out->set_cancel_forward([in] { in->cancel(); });
  in->on_ready([in, out, f = std::move(f)]() mutable { detail::chain(*in, *out, f); });
  return Future<R>(out);
}

// Resolves when every input has: with all values in input order, or with the error
// of the first input (by position) that failed.
template <class T>
auto when_all(std::vector<Future<T>> futures) -> Future<std::conditional_t<std::is_void_v<T>, void, std::vector<T>>> {
  using Out = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;
  detail::Progress* progress = futures.empty() ? nullptr : futures.front().state()->progress();
  auto out = std::make_shared<detail::State<Out>>(progress, "when_all of " + std::to_string(futures.size()));
  struct Join {
    std::vector<Future<T>> inputs;
    std::atomic<std::size_t> remaining;
  };
  auto join = std::make_shared<Join>();
  join->inputs = std::move(futures);
  join->remaining = join->inputs.size();
  out->set_cancel_forward([join] {
    for (auto& f : join->inputs)
      if (!f.ready()) f.cancel();
  });
  auto finish = [join, out] {
    try {
      if constexpr (std::is_void_v<T>) {
        for (auto& f : join->inputs) f.get();
        out->set_value();
      } else {
        std::vector<T> values;
        values.reserve(join->inputs.size());
        for (auto& f : join->inputs) values.push_back(f.get());
        out->set_value(std::move(values));
      }
    } catch (...) {
      out->set_error(std::current_exception());
    }
  };
  if (join->inputs.empty()) finish();
  for (auto& f : join->inputs)
    f.state()->on_ready([join, finish] {
      if (join->remaining.fetch_sub(1) == 1) finish();
    });
  return Future<Out>(out);
}

// Resolves with the index of the first input to resolve (value or error); that
// input's own future then holds its result.
template <class T>
Future<std::size_t> when_any(const std::vector<Future<T>>& futures) {
  TROUPE_CHECK(!futures.empty(), "when_any: needs at least one future");
  auto out = std::make_shared<detail::State<std::size_t>>(futures.front().state()->progress(),
                                                          "when_any of " + std::to_string(futures.size()));
  for (std::size_t i = 0; i < futures.size(); ++i) futures[i].state()->on_ready([out, i] { out->set_value(i); });
  return Future<std::size_t>(out);
}

// What an ask of a method returning R answers with: R, or X when the method returns a
// Future<X> (it answers later, without holding its actor's mailbox).
template <class R>
struct AnswerOf {
  using type = R;
};
template <class X>
struct AnswerOf<Future<X>> {
  using type = X;
};
template <class R>
using answer_t = typename AnswerOf<R>::type;
template <class R>
inline constexpr bool is_future_v = !std::is_same_v<answer_t<R>, R>;

// The free form, as Ray's ray.cancel(ref).
template <class T>
void cancel(const Future<T>& future) {
  future.cancel();
}

}  // namespace troupe::actors

namespace troupe {
using actors::cancel;
using actors::Deadline;
using actors::Future;
using actors::Promise;
using actors::when_all;
using actors::when_any;
}  // namespace troupe
