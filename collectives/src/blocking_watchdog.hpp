// BlockingWatchdog: keeps the timeout of collectives that run as one blocking MPI call
// (Options::direct_blocking_bytes), which nothing can interrupt once MPI is inside it.
//
// The caller brackets the call with begin()/end(): two atomic stores, no lock, no clock
// read and no thread wake-up, so the fast path stays fast (end() waits only while the
// watchdog is formatting a message about the very call that ends). A thread of the
// watchdog's own, started on first use, looks every timeout/4 (at most once a second)
// at the call in progress and times it from the first look that saw it (a call is
// known by its address and sequence number), so it fires between the timeout and the
// timeout plus one period after the call began. Such a call is a hang that no
// exception can report, so it prints the collective, its sequence number and size
// and the rank to stderr and aborts the job (MPI_Abort), for mpirun and troupe-run to
// see — the same choice PyTorch's NCCL watchdog makes.
//
// With a mismatch probe (the signature board, signature_check.hpp), each look also
// asks whether the peers published other calls at this sequence number: two ranks
// in different blocking calls may wait on each other inside MPI for ever, so from the
// second look on such a call aborts at once, with the mismatch's message.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "troupe/collectives/collective.hpp"

namespace troupe::collectives::detail {

class BlockingWatchdog {
 public:
  BlockingWatchdog(std::chrono::milliseconds timeout, int rank, int size);
  BlockingWatchdog(const BlockingWatchdog&) = delete;
  BlockingWatchdog& operator=(const BlockingWatchdog&) = delete;
  ~BlockingWatchdog();

  // `collective` must stay alive until end().
  void begin(const Collective& collective);
  void end();
  // Before the first begin(): returns the mismatch's message, or empty. Called on the
  // watchdog's thread while the caller is inside a blocking call.
  void set_mismatch_probe(std::function<std::string(const Collective&)> probe) { probe_ = std::move(probe); }

 private:
  void watch();

  const std::chrono::milliseconds timeout_;
  const int rank_, size_;
  std::mutex mutex_;  // stopping_ and the thread's sleep
  std::condition_variable stop_;
  bool stopping_ = false;
  std::once_flag started_thread_;
  std::atomic<const Collective*> current_{nullptr};
  std::atomic<bool> reading_{false};  // the watchdog looks at current_
  std::function<std::string(const Collective&)> probe_;
  std::thread thread_;
};

// begin() and end() around one blocking call, if there is a watchdog.
class WatchedCall {
 public:
  WatchedCall(BlockingWatchdog* watchdog, const Collective& collective) : watchdog_(watchdog) {
    if (watchdog_) watchdog_->begin(collective);
  }
  ~WatchedCall() {
    if (watchdog_) watchdog_->end();
  }
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  BlockingWatchdog* const watchdog_;
};

}  // namespace troupe::collectives::detail
