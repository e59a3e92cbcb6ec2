// Knowing when another rank has died, without waiting for mpirun.
//
// Two signals, watched by a small thread of its own:
// - ranks on the same host: the thread holds a pidfd (Linux >= 5.3) for each such
//   process and learns of its exit at once, however it died (kill -9 included);
// - every rank, on a ring: each rank heartbeats its nearest live successor every
//   `period` and watches its nearest live predecessor, on a communicator of its own
//   (so a beat never waits behind a large actor message); a predecessor not heard from
//   for `timeout` is declared lost, and the watcher tells every other rank (one notice
//   each). That is N beats a period for the whole job, not N^2 as with all-to-all
//   beats, so liveness stays cheap at 64 ranks. When a rank is lost its watcher moves
//   on to the next live predecessor (with a fresh `timeout` of grace), and that
//   predecessor, told by the notice, beats the watcher instead.
// Each lost rank is reported once, through `on_lost`. mpirun tears a job down one
// to a few seconds after a rank dies; this lets every caller waiting on the dead
// rank get an error first. The constructor is collective (ranks exchange host and
// pid).
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace troupe::actors::detail {

class PeerLiveness {
 public:
  using Clock = std::chrono::steady_clock;
  PeerLiveness(MPI_Comm comm, int rank, int size, std::chrono::milliseconds period, std::chrono::milliseconds timeout,
               std::function<void(int rank, const std::string& why)> on_lost);
  ~PeerLiveness();

  void start();
  void stop();
  void heard(int rank) { last_heard_[static_cast<std::size_t>(rank)].store(Clock::now().time_since_epoch().count()); }
  bool lost(int rank) const { return lost_[static_cast<std::size_t>(rank)].load(); }
  bool any_lost() const { return any_lost_.load(); }
  // Heartbeats and loss notices this rank has sent (for the liveness-cost benchmark).
  std::uint64_t messages_sent() const { return sent_.load(std::memory_order_relaxed); }
  // CPU time the liveness thread has used, as of its last wake-up (the same benchmark).
  std::chrono::nanoseconds cpu_time() const {
    return std::chrono::nanoseconds(cpu_ns_.load(std::memory_order_relaxed));
  }
  // Called from the heartbeat thread every `period` (the supervisor's heartbeat).
  void set_hook(std::function<void()> hook, std::chrono::milliseconds period);

 private:
  void run();
  void beat();
  void receive_beats();
  void check();
  void declare_lost(int rank, const std::string& why, bool tell_others);
  int successor() const;
  int predecessor() const;

  MPI_Comm comm_ = MPI_COMM_NULL;  // a dup of the actors' communicator, heartbeats only
  int rank_, size_;
  std::chrono::milliseconds period_, timeout_;
  std::function<void(int, const std::string&)> on_lost_;
  std::unique_ptr<std::atomic<Clock::rep>[]> last_heard_;
  std::unique_ptr<std::atomic<bool>[]> lost_;
  std::atomic<bool> any_lost_{false};
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::int64_t> cpu_ns_{0};
  int watched_ = -1;               // the predecessor being watched; its grace restarts when it changes
  std::vector<int> rank_numbers_;  // 0..size-1: the payloads of loss notices
  std::string heartbeat_;          // sent as is, so it outlives every MPI_Isend of it
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::function<void()> hook_;
  std::vector<int> pidfds_;       // per rank; -1 for self, other hosts, or no pidfd support
  std::vector<int> pidfd_ranks_;  // the ranks behind the open pidfds, for poll()
  std::chrono::milliseconds hook_period_{1000};
  std::thread thread_;
};

}  // namespace troupe::actors::detail
