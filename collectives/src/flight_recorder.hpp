// FlightRecorder: a communicator's last kSize calls, for hang dumps
// (Communicator::flight_record, docs/OBSERVABILITY.md).
//
// Written on every call, so it costs a clock read and a dozen plain stores: a fixed
// ring of slots, each guarded by a sequence lock (odd while being written), with one
// writer at a time (the communicator's submit lock) and readers that never block it --
// a reader comes when a rank hangs, possibly while a blocking call holds that lock.
// A slot keeps the call's figures, never its buffers (they own tensors' storage). A
// blocking call is marked done when it returns; an async one is watched through a weak
// pointer to its operation, which costs a lock, paid only by async calls.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/collectives/collective.hpp"
#include "troupe/collectives/operation.hpp"

namespace troupe::collectives::detail {

class FlightRecorder {
 public:
  static constexpr std::size_t kSize = 64;

  // A call about to start; returns its slot. One writer at a time.
  std::size_t record(const Collective& c);
  // The blocking call in `slot` (number `sequence`) has returned.
  void finished(std::size_t slot, std::uint64_t sequence);
  // The async call in `slot` is done when `operation` is (or is gone).
  void watch(std::size_t slot, std::uint64_t sequence, std::weak_ptr<const Operation> operation);
  // Oldest first: "allreduce #12 (sum, 1023 x f32 = 4092 B): started 1.204 s ago, done"
  // or "...: in flight for 5.310 s". Any thread.
  std::vector<std::string> lines() const;

 private:
  enum : std::uint8_t { running = 0, done = 1, watched = 2 };
  struct Slot {
    std::atomic<std::uint64_t> version{0};  // odd while written
    std::atomic<std::uint64_t> sequence{0};
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::int64_t> started_ns{0};  // steady_clock
    std::atomic<std::uint32_t> kind_dtype_op{0};
    std::atomic<std::int32_t> root{0};
    std::atomic<std::int32_t> tag{0};
    std::atomic<std::uint8_t> state{running};
  };
  std::array<Slot, kSize> slots_;
  std::atomic<std::uint64_t> next_{0};  // calls recorded so far
  mutable std::mutex watch_mutex_;
  std::array<std::weak_ptr<const Operation>, kSize> watched_;
};

}  // namespace troupe::collectives::detail
