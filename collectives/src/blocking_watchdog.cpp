#include "blocking_watchdog.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>

namespace troupe::collectives::detail {

BlockingWatchdog::BlockingWatchdog(std::chrono::milliseconds timeout, int rank, int size)
    : timeout_(timeout), rank_(rank), size_(size) {}

BlockingWatchdog::~BlockingWatchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BlockingWatchdog::begin(const Collective& collective) {
  std::call_once(started_thread_, [this] { thread_ = std::thread([this] { watch(); }); });
  current_.store(&collective, std::memory_order_release);
}

void BlockingWatchdog::end() {
  current_.store(nullptr);
  // The collective lives on the caller's stack: it must not go while the watchdog
  // describes it.
  while (reading_.load()) std::this_thread::yield();
}

void BlockingWatchdog::watch() {
  using Clock = std::chrono::steady_clock;
  const auto period =
      std::clamp<std::chrono::milliseconds>(timeout_ / 4, std::chrono::milliseconds(1), std::chrono::seconds(1));
  // The call seen at the last look, and when it was first seen.
  const Collective* seen = nullptr;
  std::uint64_t seen_sequence = 0;
  Clock::time_point first_seen;
  std::unique_lock lock(mutex_);
  while (!stop_.wait_for(lock, period, [&] { return stopping_; })) {
    reading_.store(true);
    const Collective* current = current_.load();
    const auto now = Clock::now();
    if (current && (current != seen || current->sequence != seen_sequence)) {
      seen = current;
      seen_sequence = current->sequence;
      first_seen = now;
    }
    if (!current) seen = nullptr;
    // From the second look at the same call: the first may come just as it starts.
    if (current && probe_ && now > first_seen) {
      const std::string mismatch = probe_(*current);
      if (!mismatch.empty()) {
        std::fprintf(stderr, "troupe: aborting the job from a blocking MPI call, which cannot be interrupted: %s\n",
                     mismatch.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    if (current && now - first_seen >= timeout_) {
      std::fprintf(stderr,
                   "troupe: %s did not complete within %lld ms on rank %d of %d (a blocking MPI call, which cannot "
                   "be interrupted); aborting the job\n",
                   current->describe().c_str(), static_cast<long long>(timeout_.count()), rank_, size_);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    reading_.store(false);
  }
}

}  // namespace troupe::collectives::detail
