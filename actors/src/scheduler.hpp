// Scheduler: which thread runs which actor, and when a sleeping thread is woken.
//
// Each actor has a mailbox (mailbox.hpp); an actor with calls waiting is "ready".
// Ready actors are run by
//   - the pool threads (RuntimeOptions::threads), which drain up to kThroughput
//     calls of one actor per turn, spin briefly when they run dry (the next message
//     usually follows at once) and then sleep on a condition variable;
//   - the thread that received the message, when it is the progress thread (or a
//     method waiting on it): an actor whose last call was short runs right there,
//     after the receive burst, with no hand-off and no wake-up (a wake-up costs
//     5-25 us on these VMs, an MPI round trip 1). An actor whose call ran longer than
//     kInlineLimit goes to the pool from then on. While such a call runs, an idle
//     pool thread (they wake every kWatchPeriod while the rank is busy) takes over
//     receiving, so a long method delays other messages by about a millisecond, not
//     by its own length: calls sent meanwhile still arrive, queue, and are seen as
//     in flight should the long call fail;
//   - the progress thread and shutdown's drain, which also run one batch of shared
//     ready work per progress step, so a pool whose threads all wait on answers
//     cannot deadlock (and with no pool threads, the progress thread runs it all).
// A stand-in leaves receiving when work is ready, and that work may be long too
// (a second task of a concurrency group): then every thread runs a call and nothing
// is received -- no cancel, kill or control-group call -- until one ends. So with
// pool threads there is also a reserve receiver, a thread that runs no calls: it
// receives while a long inline call holds the receiving thread and no pool thread
// stands in, and otherwise sleeps as an idle pool thread does.
// A pool thread is woken only when an actor becomes ready and no pool thread is
// awake to see it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "troupe/actors/detail/actor_cell.hpp"
#include "troupe/cpu_relax.hpp"

namespace troupe::actors::detail {

using troupe::detail::cpu_relax;

class Scheduler {
 public:
  // Runs one call of `lane` under supervision (the runtime's execute()).
  using Execute = std::function<void(Lane& lane, std::unique_ptr<Call> call)>;
  // `wake_progress` is called when work becomes ready that only the progress thread
  // can run (there are no pool threads); `receive` receives and delivers what has
  // arrived (true if anything did), for a pool thread standing in for a busy
  // receiving thread.
  Scheduler(int threads, Execute execute, std::function<void()> wake_progress, std::function<bool()> receive);
  ~Scheduler();

  // A wait that a message arriving for this rank ends as well (the transport's
  // doorbell, doorbell.hpp): `wait(period, ready)` returns at `ready()`, a message,
  // or the period's end. Given before start(); without one, the stand-in and the
  // reserve sleep their pauses out.
  using BellWait = std::function<void(Clock::duration period, const std::function<bool()>& ready)>;
  void set_bell_wait(BellWait wait) { bell_wait_ = std::move(wait); }

  void start();
  // Joins the pool threads; ready work left is not run.
  void stop();

  // The lane a call of `method` goes to, as a pointer that keeps `cell` alive. In a
  // concurrency group: the first lane with less than kLaneQueueBudget of work queued
  // (its backlog times its last call's time) that is not kLaneRunLimit into a call,
  // else the least loaded of those not that far into a call (ties in turn). So short
  // calls share one lane, drained in turns of kThroughput by one thread, and the
  // group's other lanes fill only when work piles up or a call runs long (see
  // docs/ACTORS.md, concurrency groups).
  static std::shared_ptr<Lane> lane_for(const std::shared_ptr<ActorCellBase>& cell, std::uint32_t method);
  static constexpr std::chrono::milliseconds kLaneQueueBudget{10};
  static constexpr std::chrono::milliseconds kLaneRunLimit{1};

  // Appends `call` to the actor's mailbox and gets the actor run if it was idle.
  void post(const std::shared_ptr<Lane>& lane, std::unique_ptr<Call> call);
  // A task that is no actor's call (a spawn's constructor): run by the pool.
  void post_task(std::function<void()> task);

  // Runs the actors this thread took on while receiving (see InlineScope) and, with
  // `shared`, one batch of the shared ready work. True if it ran anything.
  bool run_local(bool shared);
  bool has_ready() const { return ready_count_.load(std::memory_order_acquire) > 0; }

  // While one exists on a thread, post() from that thread keeps fast actors to be
  // run by this thread's next run_local() instead of handing them to the pool.
  class InlineScope {
   public:
    InlineScope();
    ~InlineScope();
    InlineScope(const InlineScope&) = delete;
    InlineScope& operator=(const InlineScope&) = delete;
  };

  // Calls longer than this move their actor off the receiving thread.
  static constexpr std::chrono::microseconds kInlineLimit{50};
  // Time the current call on this thread spent waiting for a peer to take a large
  // message (a reply's rendezvous), not counted against kInlineLimit: the thread
  // went on receiving meanwhile, and an actor that echoes 1 MB is no slower to run
  // than one that echoes 8 B -- sent to the pool, every call of it paid a wake-up.
  static void exclude_from_call_time(std::chrono::steady_clock::duration waited);
  // Calls of one actor run per turn before others get a chance.
  static constexpr int kThroughput = 64;
  // How often an idle pool thread checks for a long call on the receiving thread;
  // after kDeepSleepRounds such checks with nothing to do it sleeps until woken.
  static constexpr std::chrono::milliseconds kWatchPeriod{1};
  static constexpr int kDeepSleepRounds = 100;

 private:
  void worker();
  // For a pool thread: while the receiving thread is stuck in a long inline call,
  // receive in its place until there is work to run or the call ends.
  void stand_in();
  // The reserve receiver's loop, and whether a long inline call (begun at `since`)
  // holds the receiving thread now.
  void reserve();
  bool held_since(std::int64_t since) const;
  // Runs up to kThroughput calls of `lane` (owned by this thread); hands it to the
  // shared queue if calls remain.
  void drain(std::shared_ptr<Lane> lane, bool inline_run);
  void make_ready(std::shared_ptr<Lane> lane);
  // For the owner of a grouped lane whose call ran long: the calls that waited behind
  // it go to the group's lanes anew (lane_for), so a mispredicted burst -- long calls
  // after a run of short ones, packed on one lane -- waits for one call, not for all.
  void redeal(std::shared_ptr<Lane> lane);
  // For the receiving thread (run_local): one task or one actor's turn.
  bool run_shared_one();

  const int threads_;
  Execute execute_;
  std::function<void()> wake_progress_;
  std::function<bool()> receive_;
  BellWait bell_wait_;
  mutable std::atomic<int> on_bell_{0};  // threads pausing in bell_wait_: work made ready wakes them
  // A stand-in's or the reserve's pause: until `done()`, a message, or `period`.
  void pause_for_messages(Clock::duration period, const std::function<bool()>& done);
  bool bell_sleeper() const;  // a thread pauses on the bell (work made ready must ring it)
  bool ready_now() const;     // has_ready(), ordered as bell_sleeper() needs
  bool stopping() const;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Lane>> ready_;
  std::deque<std::function<void()>> tasks_;
  // Actors a receiving thread took on, waiting behind the one it runs now, where a
  // stand-in can take them (one receiving thread parks at a time).
  std::vector<std::shared_ptr<Lane>> parked_;
  bool parking_ = false;
  std::atomic<int> ready_count_{0};    // ready_ + tasks_, readable without the lock
  int sleeping_ = 0;                   // pool threads waiting on cv_
  std::atomic<int> deep_sleeping_{0};  // of which, waiting without a timeout
  // steady_clock ticks when the current inline call began; 0 when none runs.
  std::atomic<std::int64_t> inline_since_{0};
  std::atomic<int> spinning_{0};             // pool threads looking for work before they sleep
  std::atomic<int> standing_in_{0};          // pool threads in stand_in()
  std::atomic<bool> reserve_asleep_{false};  // the reserve is in its long (100 ms) sleep
  std::condition_variable reserve_cv_;
  bool stop_ = false;
  std::vector<std::thread> pool_;
  std::thread reserve_;
};

}  // namespace troupe::actors::detail
