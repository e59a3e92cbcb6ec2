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
  std::lock_guard lock(mutex_);
  current_ = &collective;
  started_ = std::chrono::steady_clock::now();
  if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
}

void BlockingWatchdog::end() {
  std::lock_guard lock(mutex_);
  current_ = nullptr;
}

void BlockingWatchdog::watch() {
  const auto period = std::clamp<std::chrono::milliseconds>(timeout_ / 4, std::chrono::milliseconds(1),
                                                            std::chrono::seconds(1));
  std::unique_lock lock(mutex_);
  while (!stop_.wait_for(lock, period, [&] { return stopping_; })) {
    if (!current_ || std::chrono::steady_clock::now() - started_ < timeout_) continue;
    std::fprintf(stderr,
                 "troupe: %s did not complete within %lld ms on rank %d of %d (a blocking MPI call, which cannot "
                 "be interrupted); aborting the job\n",
                 current_->describe().c_str(), static_cast<long long>(timeout_.count()), rank_, size_);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

}  // namespace troupe::collectives::detail
