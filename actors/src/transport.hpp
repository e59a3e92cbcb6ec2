// The MPI side of the runtime: sends, receives and the progress thread.
//
// Any thread may send (MPI_THREAD_MULTIPLE). Receiving is one role at a time, taken
// with try_lock by whichever thread drives progress -- the progress thread or a
// caller waiting on a future -- so messages are delivered in MPI's arrival order,
// which keeps per-sender order all the way into each actor's mailbox.
//
// The progress thread backs off when idle (a wait whose period grows to 1 ms, so an
// idle runtime costs almost no CPU), stands aside while a caller polls and for a
// moment after (its next ask polls again), and stays hot while a caller blocks on an
// answer (for up to a few ms). A caller whose answer came while it polled wakes
// nobody. In its longer sleeps (from 200 us) a message from a rank on the same node
// wakes it at once: its sender rings this rank's doorbell (doorbell.hpp).
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "doorbell.hpp"
#include "peer_liveness.hpp"
#include "scheduler.hpp"
#include "troupe/actors/bytes.hpp"
#include "troupe/actors/future.hpp"

namespace troupe::actors::detail {

struct Message {
  int source = -1;
  std::string bytes;               // header + payload (the size table removed)
  std::vector<Bytes> attachments;  // received beside it, in order
};

// Splits a message that carries its attachments within it (`whole`, received into a
// pooled buffer the attachments go on sharing); false (with a log line) when its size
// table does not describe it. Free of MPI, so tests/fuzz feeds it arbitrary bytes.
bool split_attached(Message& message, const Bytes& whole);

// Receive buffers for attachments, reused by size class so that a steady stream of
// large messages neither zero-fills nor first-touches fresh memory each time.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  Bytes acquire(std::size_t size);

 private:
  std::mutex mutex_;
  std::vector<std::vector<std::unique_ptr<std::byte[]>>> free_;  // by power-of-two class
};

class Transport final : public Progress {
 public:
  using Deliver = std::function<void(Message)>;
  // `liveness` (may be null) hears of every received message: any message proves
  // its sender alive, even one that kept the heartbeats waiting.
  // `runs_actor_calls`: there are no pool threads, so the progress thread runs every
  // actor call itself (RuntimeOptions::threads == 0).
  // `attachment_timeout`: RuntimeOptions::attachment_timeout.
  // `doorbells` (may be null): rung for each message to a rank of this node, and
  // armed by this rank's progress thread in its longer sleeps (doorbell.hpp).
  Transport(MPI_Comm comm, Deliver deliver, Scheduler& scheduler, PeerLiveness* liveness, bool runs_actor_calls = false,
            std::chrono::milliseconds attachment_timeout = std::chrono::seconds(10), Doorbells* doorbells = nullptr);
  ~Transport() override;

  void start();
  // Joins the progress thread; receiving stops unless a caller drives it.
  void stop();
  // Sends header + payload and the attachments, each from its own buffer; patches
  // the header's attachment fields and inserts the size table (wire.hpp). Up to
  // kAttachedLimit in all, one MPI message carries everything (an hindexed datatype
  // over the pieces): over TCP a second message cost a 64 KB ask 1.34x raw MPI's
  // time against 1.21x with one. Above it each attachment is an MPI message of its
  // own, which the receiver posts with its exact size once the header is in: Open
  // MPI's shared memory then copies it once, straight from this buffer (received by
  // probe, a 16 MB round trip took 2.8x raw MPI), and TCP streams it without a
  // datatype's packing (one message of 1 MB took 1.4-2.4x raw MPI over TCP).
  void send(int destination, std::string& message, const std::vector<Bytes>& attachments = {});

  bool progress_once(bool run_local_calls) override;
  bool try_begin_polling() override;
  bool is_progress_thread() const override {
    return std::this_thread::get_id() == thread_id_.load(std::memory_order_relaxed);
  }
  void end_polling() override;
  bool take_woke_sleeper() override;
  void begin_blocking() override;
  void end_blocking() override;

  std::uint64_t sent() const { return sent_.load(); }
  std::uint64_t received() const { return received_.load(); }
  // Wakes the progress thread from idle_wait() (and any thread in wait_for_message).
  void wake();
  // With doorbells: waits up to `period` for a message to arrive, `ready()` or wake();
  // false without doorbells (returning at once).
  bool has_doorbells() const { return doorbells_ != nullptr; }
  bool wait_for_message(Clock::duration period, const std::function<bool()>& ready);
  // Receives and delivers what has arrived, if no other thread is receiving.
  bool receive() { return receive_some(); }
  // Blocks until `request` (on a communicator of its own: the runtime's collectives)
  // completes or `give_up()` turns true; false if it gave up. The progress thread
  // tests the request between its polls and signals completion, so the waiting
  // thread sleeps on a condition variable instead of spinning: a rank waiting in
  // shutdown for a peer still at work must not keep a core busy. On the progress
  // thread itself (or once it has stopped) the caller drives progress instead.
  // interrupt_waits() makes a waiter look at `give_up()` again.
  bool wait_request(MPI_Request* request, const std::function<bool()>& give_up);
  void interrupt_waits();

 private:
  void run();
  // Sleeps up to `period` (or until `done`) when idle; without pool threads, runs an
  // actor call instead if one is posted meanwhile. With `doorbell`, a message that
  // arrives meanwhile ends the sleep too (rung by its sender); true then.
  bool idle_wait(Clock::duration period, const std::function<bool()>& done, bool doorbell = false);
  bool receive_some();

  // A message waiting for its attachments (separate MPI messages), or held behind one
  // from the same sender that is: per-sender order holds, and the receiving thread
  // never waits on a sender. Touched only by the receiving thread.
  struct Held {
    Message message;
    std::vector<std::uint64_t> sizes{};  // its attachments' sizes (empty: complete)
    int tag = 0;
    std::size_t next = 0;  // the attachment being received
    MPI_Request request = MPI_REQUEST_NULL;
    Bytes buffer{};
    Clock::time_point deadline{};  // for the next attachment to begin arriving
  };
  enum class HeldState { ready, waiting, dropped };
  // Reads `message`'s size table and holds it; false (with a log line) if malformed.
  bool hold(Message message);
  // Posts, tests and checks the next attachments of `held` without blocking.
  HeldState advance(Held& held);
  // Delivers what is complete, in order per sender; true while anything is held.
  bool advance_held();
  void cancel_held();

  MPI_Comm comm_;
  Deliver deliver_;
  Scheduler& scheduler_;
  const bool runs_actor_calls_;
  std::mutex receive_mutex_;
  std::atomic<int> pollers_{0};
  std::atomic<int> blocked_{0};            // callers asleep on an answer
  std::atomic<Clock::rep> hot_until_{0};   // steady_clock ticks; stay hot until then
  std::atomic<Clock::rep> poll_ended_{0};  // steady_clock ticks when a caller last stopped polling
  std::atomic<bool> stop_{false};
  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  std::thread thread_;
  // Set by the thread itself before it runs anything: written only by the creating
  // thread, after the thread had started, it raced with the thread's own reads.
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<std::uint64_t> sent_{0}, received_{0};
  PeerLiveness* liveness_;
  Doorbells* doorbells_;
  int rank_ = 0;  // in comm_
  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();
  std::atomic<std::uint32_t> next_attachment_tag_{0};
  const std::chrono::milliseconds attachment_timeout_;
  std::map<int, std::deque<Held>> held_;  // by sender
  // wait_request(): one waiter at a time; the request the progress thread tests.
  std::mutex request_waiter_mutex_;
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::atomic<MPI_Request*> watched_{nullptr};
  bool watch_done_ = false;  // under watch_mutex_
  // On the progress thread: tests the watched request and signals its completion.
  void test_watched();
};

}  // namespace troupe::actors::detail
