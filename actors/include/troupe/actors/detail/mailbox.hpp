// An actor's mailbox: the calls waiting for it, in the order they were posted, and
// whether some thread has the actor scheduled (queued to run, or running it).
//
// At most one thread runs an actor at a time: whoever moves `scheduled` from false
// to true owns the actor until it finds the mailbox empty and sets it back, under
// the same lock, so a call posted meanwhile is never stranded. The owner drains
// several calls per turn (CAF's and Akka's "throughput"), so a burst of messages to
// one actor costs one scheduling and no thread wake-up per message.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

namespace troupe::actors {
struct ErrorInfo;
}

namespace troupe::actors::detail {

// One queued call: what to run, and what to do instead when it cannot run (the
// actor is dead, or the call went stale in a restart). One heap node per call.
class Call {
 public:
  explicit Call(std::uint32_t method) : method_(method) {}
  virtual ~Call() = default;
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

 private:
  friend class Mailbox;
  std::uint32_t method_;
  int epoch_ = 0;                  // the actor's restart count when the call was posted
  std::int64_t posted_ticks_ = 0;  // steady_clock ticks, for queue_deadline
  std::unique_ptr<Call> next_;
};

template <class Body, class Fail>
class CallOf final : public Call {
 public:
  CallOf(std::uint32_t method, Body body, Fail fail) : Call(method), body_(std::move(body)), fail_(std::move(fail)) {}
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

class Mailbox {
 public:
  Mailbox() = default;
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;
  ~Mailbox() { clear(); }

  // Appends `call`; true when the actor was idle and the caller now owns it (must
  // get it run).
  bool push(std::unique_ptr<Call> call) {
    std::lock_guard lock(mutex_);
    Call* raw = call.get();
    if (tail_) tail_->next_ = std::move(call);
    else head_ = std::move(call);
    tail_ = raw;
    if (scheduled_) return false;
    scheduled_ = true;
    return true;
  }
  // For the owner: the next call, or null -- and then the actor is idle again.
  std::unique_ptr<Call> pop() {
    std::lock_guard lock(mutex_);
    if (!head_) {
      scheduled_ = false;
      return nullptr;
    }
    std::unique_ptr<Call> call = std::move(head_);
    head_ = std::move(call->next_);
    if (!head_) tail_ = nullptr;
    return call;
  }
  // Destroys the waiting calls unrun (shutdown), one by one: a recursive destruction
  // of a long list would overflow the stack.
  void clear() {
    std::unique_ptr<Call> head;
    {
      std::lock_guard lock(mutex_);
      head = std::move(head_);
      tail_ = nullptr;
    }
    while (head) head = std::move(head->next_);
  }

 private:
  std::mutex mutex_;
  std::unique_ptr<Call> head_;
  Call* tail_ = nullptr;
  bool scheduled_ = false;
};

}  // namespace troupe::actors::detail
