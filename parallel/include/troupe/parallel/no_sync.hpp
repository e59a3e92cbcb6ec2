// NoSync: while it lives, a data-parallel wrapper's backward only accumulates gradients
// locally (torch's `with ddp.no_sync():`); the first backward after it synchronises
// the sum. One guard for DDP, ShardedDataParallel and FSDP: it turns the wrapper's sync
// flag off and restores what it was. Every rank must open and close it together.
#pragma once

namespace troupe::parallel {

class NoSync {
 public:
  explicit NoSync(bool& sync) : sync_(&sync), previous_(sync) { sync = false; }
  NoSync(NoSync&& other) noexcept : sync_(other.sync_), previous_(other.previous_) { other.sync_ = nullptr; }
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;
  NoSync& operator=(NoSync&&) = delete;
  ~NoSync() {
    if (sync_) *sync_ = previous_;
  }

 private:
  bool* sync_;
  bool previous_;
};

}  // namespace troupe::parallel
