#include "scheduler.hpp"

#include <algorithm>
#include <functional>

namespace troupe::actors::detail {

namespace {
using Clock = std::chrono::steady_clock;
// How long a pool thread that ran dry looks for more work before it sleeps: a
// stream of messages to one actor usually has its next message here within a few
// microseconds, and sleeping in between would cost a wake-up per message.
constexpr auto kSpin = std::chrono::microseconds(50);
// A thread receiving in place of a busy receiving thread polls without a system call
// for kStandInHot after its last message (the next ask of a caller in a loop comes
// within microseconds, and sched_yield costs over 1 us on these VMs: yielding at once
// made a control-group ask during a long call 2.5x an idle one), then yields the core
// between polls until kStandInSpin, then pauses for up to kStandInPause between them.
constexpr auto kStandInHot = std::chrono::microseconds(20);
constexpr auto kStandInSpin = std::chrono::microseconds(200);
constexpr auto kStandInPause = std::chrono::milliseconds(1);

// The polling of a stand-in or the reserve: `receive` while `keep()` holds, pacing the
// polls as above; pause(duration) waits and returns false to stop at once.
template <class Keep, class Pause>
void receive_while(const std::function<bool()>& receive, Keep keep, Pause pause) {
  auto last_received = Clock::now();
  while (keep()) {
    if (receive()) {
      last_received = Clock::now();
      continue;
    }
    const auto quiet = Clock::now() - last_received;
    if (quiet < kStandInHot) {
      for (int i = 0; i < 2; ++i) cpu_relax();
    } else if (quiet < kStandInSpin) {
      std::this_thread::yield();
    } else if (!pause(std::min<Clock::duration>(kStandInPause, quiet / 8))) {
      return;
    }
  }
}

// The actors this thread took on in post() while inside an InlineScope.
thread_local std::vector<std::shared_ptr<Lane>> t_inline;
thread_local int t_inline_depth = 0;
thread_local Scheduler* t_scheduler = nullptr;
thread_local Clock::duration t_excluded{0};
}  // namespace

Scheduler::Scheduler(int threads, Execute execute, std::function<void()> wake_progress, std::function<bool()> receive)
    : threads_(threads),
      execute_(std::move(execute)),
      wake_progress_(std::move(wake_progress)),
      receive_(std::move(receive)) {}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
  for (int i = 0; i < threads_; ++i) pool_.emplace_back([this] { worker(); });
  if (threads_ > 0) reserve_ = std::thread([this] { reserve(); });
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  reserve_cv_.notify_all();
  if (bell_wait_) wake_progress_();  // rings this rank's bell: pauses on it end
  for (auto& t : pool_) t.join();
  pool_.clear();
  if (reserve_.joinable()) reserve_.join();
  std::lock_guard lock(mutex_);
  ready_.clear();
  tasks_.clear();
  ready_count_ = 0;
}

Scheduler::InlineScope::InlineScope() { ++t_inline_depth; }

void Scheduler::exclude_from_call_time(Clock::duration waited) { t_excluded += waited; }

Scheduler::InlineScope::~InlineScope() {
  if (--t_inline_depth > 0 || t_inline.empty()) return;
  // Actors taken on but not run (the receiving thread left before its run_local):
  // they must not be stranded.
  auto lanes = std::move(t_inline);
  t_inline.clear();
  for (auto& lane : lanes) t_scheduler->make_ready(std::move(lane));
}

void Scheduler::post(const std::shared_ptr<Lane>& lane, std::unique_ptr<Call> call) {
  if (!lane->mailbox().push(std::move(call))) return;  // its owner will get to it
  if (t_inline_depth > 0 && (t_scheduler == nullptr || t_scheduler == this) && (threads_ == 0 || lane->fast())) {
    t_scheduler = this;
    t_inline.push_back(lane);
    return;
  }
  make_ready(lane);
}

void Scheduler::post_task(std::function<void()> task) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
    ready_count_.fetch_add(1, std::memory_order_seq_cst);
    wake = sleeping_ > 0;
  }
  if (threads_ == 0 || bell_sleeper()) wake_progress_();
  if (threads_ > 0 && wake) cv_.notify_one();
}

void Scheduler::make_ready(std::shared_ptr<Lane> lane) {
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    ready_.push_back(std::move(lane));
    ready_count_.fetch_add(1, std::memory_order_seq_cst);
    // A spinning pool thread will see it; otherwise wake a sleeping one.
    wake = sleeping_ > 0 && spinning_.load() == 0;
  }
  if (threads_ == 0 || bell_sleeper()) wake_progress_();
  if (threads_ > 0 && wake) cv_.notify_one();
}

void Scheduler::drain(std::shared_ptr<Lane> lane, bool inline_run) {
  // One clock read per call: a call starts when the one before it ended (a read
  // costs ~35 ns here, a local tell well under 1 us).
  auto start = Clock::now();
  for (int i = 0; i < kThroughput; ++i) {
    std::unique_ptr<Call> call = lane->mailbox().pop();
    if (!call) return;  // idle again; a later post() schedules it anew
    const bool watched = inline_run && threads_ > 0;
    if (watched) {
      inline_since_.store(start.time_since_epoch().count(), std::memory_order_relaxed);
      // A pool thread that slept deeply would not notice a long call; the first
      // inline call after an idle spell wakes one.
      if (deep_sleeping_.load(std::memory_order_relaxed) > 0) cv_.notify_one();
      if (reserve_asleep_.load(std::memory_order_relaxed)) reserve_cv_.notify_one();
    }
    t_excluded = Clock::duration::zero();
    lane->running_since_ticks_.store(start.time_since_epoch().count(), std::memory_order_relaxed);
    execute_(*lane, std::move(call));
    // Counted once it is done, not when popped: in between, the lane would look idle
    // and empty to lane_for, which could queue a call behind one about to run long.
    if (lane->grouped()) lane->count_taken();
    if (watched) inline_since_.store(0, std::memory_order_relaxed);
    const auto end = Clock::now();
    const auto took = end - start - t_excluded;
    const bool fast = took < kInlineLimit;
    start = end;
    lane->set_fast(fast);
    if (lane->grouped()) {
      lane->set_last_call(took.count());
      if (took >= kLaneRunLimit) return redeal(std::move(lane));
    }
    if (inline_run && !fast && threads_ > 0) break;  // the rest goes to the pool
  }
  make_ready(std::move(lane));  // calls remain and this thread still owns the actor
}

bool Scheduler::run_shared_one() {
  std::shared_ptr<Lane> lane;
  std::function<void()> task;
  {
    std::lock_guard lock(mutex_);
    if (!tasks_.empty()) {
      task = std::move(tasks_.front());
      tasks_.pop_front();
    } else if (!ready_.empty()) {
      lane = std::move(ready_.front());
      ready_.pop_front();
    } else {
      return false;
    }
    ready_count_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (task) task();
  // Run on the receiving thread like its own actors: watched, so that a stand-in
  // receives should the call run long.
  else
    drain(std::move(lane), threads_ > 0);
  return true;
}

bool Scheduler::run_local(bool shared) {
  bool ran = false;
  // Calls run here may make more actors ready on this thread; a few rounds, then
  // the InlineScope hands the rest to the pool.
  for (int round = 0; round < 4 && !t_inline.empty(); ++round) {
    auto lanes = std::move(t_inline);
    t_inline.clear();
    for (std::size_t i = 0; i < lanes.size();) {
      auto lane = std::move(lanes[i++]);
      bool parked = false;
      if (i < lanes.size() && threads_ > 0) {
        // The actors after this one wait where a stand-in can take them, should
        // this call run long.
        std::lock_guard lock(mutex_);
        if (!parking_) {
          parking_ = parked = true;
          parked_.assign(std::make_move_iterator(lanes.begin() + static_cast<std::ptrdiff_t>(i)),
                         std::make_move_iterator(lanes.end()));
          lanes.clear();
          i = 0;
        }
      }
      drain(std::move(lane), threads_ > 0);
      if (parked) {
        std::lock_guard lock(mutex_);
        lanes.swap(parked_);  // those the stand-in did not take
        parked_.clear();
        parking_ = false;
      }
    }
    ran = true;
  }
  if (shared && has_ready()) ran = run_shared_one() || ran;
  return ran;
}

bool Scheduler::bell_sleeper() const {
  // After the work is published (ready_count_, seq_cst): a pauser either sees it in its
  // last look or is counted here. Dekker's order with sequentially consistent operations
  // on both sides (pause_for_messages, ready_now); a plain load on x86.
  return on_bell_.load(std::memory_order_seq_cst) > 0;
}

bool Scheduler::ready_now() const { return ready_count_.load(std::memory_order_seq_cst) > 0; }

void Scheduler::pause_for_messages(Clock::duration period, const std::function<bool()>& done) {
  on_bell_.fetch_add(1, std::memory_order_seq_cst);
  bell_wait_(period, done);
  on_bell_.fetch_sub(1, std::memory_order_seq_cst);
}

bool Scheduler::stopping() const {
  std::lock_guard lock(mutex_);
  return stop_;
}

bool Scheduler::held_since(std::int64_t since) const {
  return since != 0 && inline_since_.load(std::memory_order_relaxed) == since &&
         Clock::now().time_since_epoch().count() - since > Clock::duration(kInlineLimit).count();
}

void Scheduler::reserve() {
  std::unique_lock lock(mutex_);
  for (int idle_rounds = 0; !stop_;) {
    const std::int64_t since = inline_since_.load(std::memory_order_relaxed);
    if (held_since(since) && standing_in_.load(std::memory_order_relaxed) == 0) {
      lock.unlock();
      bool stopped = false;
      // MPI has no wake-up to block on: when quiet, poll again within kStandInPause, or
      // at once on stop().
      receive_while(
          receive_, [&] { return held_since(since) && standing_in_.load(std::memory_order_relaxed) == 0; },
          [&](Clock::duration pause) {
            if (bell_wait_) {  // a message rings: no waiting out the pause
              pause_for_messages(pause, [this] { return stopping(); });
              stopped = stopping();
              return !stopped;
            }
            std::unique_lock paused(mutex_);
            stopped = reserve_cv_.wait_for(paused, pause, [this] { return stop_; });
            return !stopped;
          });
      if (stopped) return;
      lock.lock();
      idle_rounds = 0;
      continue;
    }
    if (since != 0 || idle_rounds < kDeepSleepRounds) {
      reserve_cv_.wait_for(lock, kWatchPeriod);
      idle_rounds = since != 0 ? 0 : idle_rounds + 1;
    } else {
      reserve_asleep_.store(true, std::memory_order_relaxed);
      // Woken by the first inline call after an idle spell (drain) or by stop().
      reserve_cv_.wait_for(lock, std::chrono::milliseconds(100));
      reserve_asleep_.store(false, std::memory_order_relaxed);
      idle_rounds = 0;
    }
  }
}

void Scheduler::stand_in() {
  standing_in_.fetch_add(1, std::memory_order_relaxed);
  struct Leave {
    std::atomic<int>& count;
    ~Leave() { count.fetch_sub(1, std::memory_order_relaxed); }
  } leave{standing_in_};
  const std::int64_t since = inline_since_.load(std::memory_order_relaxed);
  {
    // Actors received together with the long call would wait behind it: run them.
    std::lock_guard lock(mutex_);
    for (auto& lane : parked_) ready_.push_back(std::move(lane));
    ready_count_.fetch_add(static_cast<int>(parked_.size()), std::memory_order_release);
    parked_.clear();
  }
  // Nothing arrives for a while: the long call (a training step, say) needs this core
  // more than the next message needs an answer within microseconds. Pause as a
  // sleeping pool thread does, so that an actor made ready wakes us at once; MPI is
  // polled again within kStandInPause. Spinning here took a third of a core from a
  // 2-rank job.
  receive_while(
      receive_, [&] { return !has_ready() && inline_since_.load(std::memory_order_relaxed) == since; },
      [&](Clock::duration pause) {
        if (bell_wait_) {  // a message rings, and an actor made ready (bell_sleeper)
          pause_for_messages(pause, [this] { return ready_now() || stopping(); });
          return !stopping();
        }
        std::unique_lock lock(mutex_);
        ++sleeping_;
        cv_.wait_for(lock, pause, [&] { return stop_ || has_ready(); });
        --sleeping_;
        return !stop_;
      });
}

void Scheduler::worker() {
  for (bool ran = false;; ran = true) {
    // Only a thread that just ran dry expects more soon -- and not while a long call
    // holds the receiving thread: then nothing arrives unless this thread receives.
    if (ran && inline_since_.load(std::memory_order_relaxed) == 0) {
      spinning_.fetch_add(1);
      const auto until = Clock::now() + kSpin;
      for (int i = 0; !has_ready(); ++i) {
        if ((i & 63) == 63 && Clock::now() >= until) break;
        cpu_relax();
      }
      spinning_.fetch_sub(1);
    }
    std::shared_ptr<Lane> lane;
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      for (int idle_rounds = 0; ready_.empty() && tasks_.empty() && !stop_;) {
        // A long call holds the receiving thread (this thread may just have run a call
        // received meanwhile): receive in its place now, not after a watch period --
        // else every message to a busy rank waited up to kWatchPeriod.
        if (const std::int64_t since = inline_since_.load(std::memory_order_relaxed);
            since != 0 && Clock::now().time_since_epoch().count() - since > Clock::duration(kInlineLimit).count()) {
          lock.unlock();
          stand_in();
          lock.lock();
          idle_rounds = 0;
          continue;
        }
        ++sleeping_;
        if (idle_rounds < kDeepSleepRounds) {
          cv_.wait_for(lock, kWatchPeriod);
        } else {
          ++deep_sleeping_;
          cv_.wait(lock);
          --deep_sleeping_;
          idle_rounds = 0;
        }
        --sleeping_;
        const std::int64_t since = inline_since_.load(std::memory_order_relaxed);
        if (since != 0 && Clock::now().time_since_epoch().count() - since > Clock::duration(kInlineLimit).count()) {
          lock.unlock();
          stand_in();
          lock.lock();
          idle_rounds = 0;
        } else {
          ++idle_rounds;
        }
      }
      if (stop_) return;
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      } else {
        lane = std::move(ready_.front());
        ready_.pop_front();
      }
      ready_count_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (task)
      task();
    else
      drain(std::move(lane), false);
  }
}

}  // namespace troupe::actors::detail
