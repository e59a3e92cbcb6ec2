// One call of an actor as it waits in the mailbox and runs: what to run, what to do
// instead when it cannot run, and what cancellation needs -- who asked (rank and
// request id), the call's deadline, whether it was cancelled before it ran, and the
// token a running method polls (this_call.hpp).
//
// A call that can be cancelled (an ask; a tell has nobody to tell) is listed in its
// actor's CallRegistry from the moment it is queued until it is destroyed, so that a
// cancel message naming (rank, request) can find it. Whoever claims it first owns its
// outcome: the thread about to run it (claim_to_run) or a cancel (claim_to_cancel),
// which then answers the asker itself; the runner of an unclaimable call drops it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include "troupe/actors/detail/call_memory.hpp"

namespace troupe::actors {
struct ErrorInfo;
}

namespace troupe::actors::detail {

class CallRegistry;
class Mailbox;

class Call {
 public:
  explicit Call(std::uint32_t method) : method_(method) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  virtual ~Call() = default;
  // Recycled memory (call_memory.hpp); an over-aligned call gets the global allocator's.
  static void* operator new(std::size_t bytes) { return allocate_call(bytes); }
  static void operator delete(void* block, std::size_t bytes) noexcept { free_call(block, bytes); }
  static void* operator new(std::size_t bytes, std::align_val_t align) { return ::operator new(bytes, align); }
  // Unsized: clang before 19 declares sized global deletes only with -fsized-deallocation.
  static void operator delete(void* block, std::size_t, std::align_val_t align) noexcept {
    ::operator delete(block, align);
  }
  virtual void run() = 0;
  virtual void fail(const ErrorInfo& info) = 0;

  // Set by the runtime when the call is posted.
  void stamp(int epoch, std::int64_t posted_ticks) {
    epoch_ = epoch;
    posted_ticks_ = posted_ticks;
  }
  std::uint32_t method() const { return method_; }
  int epoch() const { return epoch_; }
  std::int64_t posted_ticks() const { return posted_ticks_; }

  // An ask: who asked, and the request id its answer carries.
  void set_request(int source, std::uint64_t request) {
    source_ = source;
    request_ = request;
  }
  int source() const { return source_; }
  std::uint64_t request() const { return request_; }
  // steady_clock ticks after which the call must not start; 0: none.
  void set_deadline(std::int64_t ticks) { deadline_ticks_ = ticks; }
  std::int64_t deadline_ticks() const { return deadline_ticks_; }

  // The thread about to run (or fail) the call takes it; false when a cancel did first.
  bool claim_to_run() {
    auto expected = kQueued;
    return state_.compare_exchange_strong(expected, kRunning, std::memory_order_acq_rel);
  }
  // A running method's token: set by a cancel that found it running.
  bool cancel_requested() const { return cancel_requested_.load(std::memory_order_relaxed); }

 protected:
  // Called first by the final class's destructor, while its members still live.
  void unregister();

 private:
  friend class CallRegistry;
  friend class Mailbox;
  static constexpr std::uint8_t kQueued = 0, kRunning = 1, kCancelled = 2;

  std::uint32_t method_;
  int epoch_ = 0;                  // the actor's restart count when the call was posted
  std::int64_t posted_ticks_ = 0;  // steady_clock ticks, for queue_deadline
  Call* next_ = nullptr;           // in a mailbox, which owns it
  int source_ = -1;
  std::uint64_t request_ = 0;
  std::int64_t deadline_ticks_ = 0;
  std::atomic<std::uint8_t> state_{kQueued};
  std::atomic<bool> cancel_requested_{false};
  // The registry this call is listed in (asks only), and its neighbours there.
  CallRegistry* registry_ = nullptr;
  Call* registry_prev_ = nullptr;
  Call* registry_next_ = nullptr;
};

// An actor's asks that are queued or running, findable by (source rank, request id).
// A mutex, not a lock-free list: it is taken twice per ask by threads that seldom
// meet, and a cancel walks the list.
class CallRegistry {
 public:
  enum class Found { nothing, claimed, running };

  void add(Call& call) {
    std::lock_guard lock(mutex_);
    call.registry_ = this;
    call.registry_next_ = head_;
    if (head_) head_->registry_prev_ = &call;
    head_ = &call;
  }
  void remove(Call& call) {
    std::lock_guard lock(mutex_);
    if (call.registry_prev_)
      call.registry_prev_->registry_next_ = call.registry_next_;
    else
      head_ = call.registry_next_;
    if (call.registry_next_) call.registry_next_->registry_prev_ = call.registry_prev_;
    call.registry_ = nullptr;
  }
  // Cancels the ask (source, request): `claimed` if it had not started (it will not
  // run; the caller answers the asker), `running` if its token was set, `nothing`
  // if it is not here (finished, or never arrived).
  // `method` receives the call's method index.
  Found cancel(int source, std::uint64_t request, std::uint32_t* method) {
    std::lock_guard lock(mutex_);
    for (Call* c = head_; c; c = c->registry_next_) {
      if (c->source_ != source || c->request_ != request) continue;
      *method = c->method_;
      auto expected = Call::kQueued;
      if (c->state_.compare_exchange_strong(expected, Call::kCancelled, std::memory_order_acq_rel))
        return Found::claimed;
      if (expected != Call::kRunning) return Found::nothing;
      c->cancel_requested_.store(true, std::memory_order_relaxed);
      return Found::running;
    }
    return Found::nothing;
  }
  // Sets the token of every call that runs now (Runtime::kill).
  void cancel_running() {
    std::lock_guard lock(mutex_);
    for (Call* c = head_; c; c = c->registry_next_)
      if (c->state_.load(std::memory_order_acquire) == Call::kRunning)
        c->cancel_requested_.store(true, std::memory_order_relaxed);
  }

 private:
  std::mutex mutex_;
  Call* head_ = nullptr;
};

inline void Call::unregister() {
  if (registry_) registry_->remove(*this);
}

template <class Body, class Fail>
class CallOf final : public Call {
 public:
  CallOf(std::uint32_t method, Body body, Fail fail) : Call(method), body_(std::move(body)), fail_(std::move(fail)) {}
  // Out of the registry before body_ and fail_ go: a cancel may be looking at it.
  ~CallOf() override { unregister(); }
  void run() override { body_(); }
  void fail(const ErrorInfo& info) override { fail_(info); }

 private:
  Body body_;
  Fail fail_;
};

template <class Body, class Fail>
std::unique_ptr<Call> make_call(std::uint32_t method, Body body, Fail fail) {
  return std::make_unique<CallOf<Body, Fail>>(method, std::move(body), std::move(fail));
}

}  // namespace troupe::actors::detail
