#include "troupe/actors/future.hpp"

#include <thread>

#include "troupe/actors/errors.hpp"

namespace troupe::actors::detail {

void StateBase::set_error(std::exception_ptr error) {
  std::unique_lock lock(mutex_);
  if (ready()) return;
  error_ = std::move(error);
  finish(std::move(lock));
}

void StateBase::finish(std::unique_lock<std::mutex> lock) {
  ready_.store(true, std::memory_order_release);
  std::vector<std::function<void()>> callbacks;
  callbacks.swap(callbacks_);
  lock.unlock();
  cv_.notify_all();
  for (auto& callback : callbacks) callback();
}

void StateBase::on_ready(std::function<void()> callback) {
  {
    std::lock_guard lock(mutex_);
    if (!ready()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

void StateBase::rethrow_if_error() const {
  if (error_) std::rethrow_exception(error_);
}

void StateBase::cancel() {
  if (ready()) return;
  if (cancel_forward_) return cancel_forward_();
  if (call_.canceller == nullptr)
    TROUPE_THROW(InvalidArgument, "cancel: '", what(), "' answers no ask (a Promise's future cannot be cancelled)");
  if (call_.collective)
    TROUPE_THROW(InvalidArgument, "cancel: '", what(),
                 "' cannot be cancelled: the method is listed in troupe_collective, and a collective cannot be "
                 "abandoned on one rank");
  call_.canceller->cancel_call(call_, *this);
}

void StateBase::expire() {
  set_error(std::make_exception_ptr(DeadlineExceeded(
      {ErrorCode::deadline_exceeded, call_.rank, "", what(), "", "no answer came before the call's deadline"})));
  call_.canceller->cancel_call(call_, *this);  // the work is no longer wanted
}

bool StateBase::wait_until(std::optional<Clock::time_point> deadline) {
  if (call_deadline_ && call_.canceller != nullptr && (!deadline || *call_deadline_ <= *deadline)) {
    if (!wait_until_impl(call_deadline_)) expire();
    return true;
  }
  return wait_until_impl(deadline);
}

bool StateBase::wait_until_impl(std::optional<Clock::time_point> deadline) {
  if (ready()) return true;
  if (progress_ != nullptr && progress_->is_progress_thread()) {
    // A method running on the progress thread waits for an answer: no other thread
    // would receive it, so this one keeps receiving until it comes.
    while (!ready()) {
      if (deadline && Clock::now() >= *deadline) return false;
      if (!progress_->progress_once(/*run_local_calls=*/true)) std::this_thread::yield();
    }
    return true;
  }
  // The ask (or cancel) woke a thread of this node to answer it: the scheduler may
  // have queued that thread on this core, where a spinning waiter keeps it off for a
  // whole slice (EEVDF lets the running thread finish its slice). Yield between polls
  // then: an ask to a rank whose receiver slept took 250 us spinning, 60 us yielding.
  // Answers from running threads come sooner to a waiter that does not yield.
  const bool yielding = progress_ != nullptr && progress_->take_woke_sleeper();
  if (progress_ != nullptr && progress_->try_begin_polling()) {
    // Poll phase: drive the transport ourselves instead of paying for a wake-up.
    // The clock is read every few empty polls only: on these VMs a read costs about
    // as much as an empty poll, and the budget need not be exact.
    const auto poll_end = Clock::now() + kPollBudget;
    for (unsigned empty = 0; !ready();) {
      if (progress_->progress_once(/*run_local_calls=*/false)) continue;
      if (yielding) std::this_thread::yield();
      if (++empty % 8 != 0) continue;
      const auto now = Clock::now();
      if ((deadline && now >= *deadline) || now >= poll_end) break;
    }
    progress_->end_polling();
    if (ready()) return true;  // the usual case: no wake-up, no sleep
  }
  if (progress_ != nullptr) progress_->begin_blocking();
  bool done = true;
  {
    std::unique_lock lock(mutex_);
    if (deadline)
      done = cv_.wait_until(lock, *deadline, [this] { return ready(); });
    else
      cv_.wait(lock, [this] { return ready(); });
  }
  if (progress_ != nullptr) progress_->end_blocking();
  return done;
}

}  // namespace troupe::actors::detail
