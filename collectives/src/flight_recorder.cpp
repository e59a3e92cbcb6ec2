#include "flight_recorder.hpp"

#include <chrono>
#include <cstdio>

namespace troupe::collectives::detail {

namespace {
std::int64_t now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
}  // namespace

std::size_t FlightRecorder::record(const Collective& c) {
  const std::uint64_t n = next_.load(std::memory_order_relaxed);
  Slot& s = slots_[n % kSize];
  const std::uint64_t v = s.version.load(std::memory_order_relaxed);
  s.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // readers see odd before any field changes
  s.sequence.store(c.sequence, std::memory_order_relaxed);
  s.count.store(c.count, std::memory_order_relaxed);
  s.started_ns.store(now_ns(), std::memory_order_relaxed);
  s.kind_dtype_op.store(static_cast<std::uint32_t>(c.kind) | static_cast<std::uint32_t>(c.dtype) << 8 |
                            static_cast<std::uint32_t>(c.op) << 16,
                        std::memory_order_relaxed);
  s.root.store(c.root, std::memory_order_relaxed);
  s.tag.store(c.tag, std::memory_order_relaxed);
  s.state.store(running, std::memory_order_relaxed);
  s.version.store(v + 2, std::memory_order_release);
  next_.store(n + 1, std::memory_order_release);
  return n % kSize;
}

void FlightRecorder::finished(std::size_t slot, std::uint64_t sequence) {
  Slot& s = slots_[slot];
  if (s.sequence.load(std::memory_order_relaxed) == sequence) s.state.store(done, std::memory_order_release);
}

void FlightRecorder::watch(std::size_t slot, std::uint64_t sequence, std::weak_ptr<const Operation> operation) {
  std::lock_guard lock(watch_mutex_);
  Slot& s = slots_[slot];
  if (s.sequence.load(std::memory_order_relaxed) != sequence) return;
  watched_[slot] = std::move(operation);
  s.state.store(watched, std::memory_order_release);
}

std::vector<std::string> FlightRecorder::lines() const {
  std::vector<std::string> out;
  const std::uint64_t n = next_.load(std::memory_order_acquire);
  const std::int64_t now = now_ns();
  for (std::uint64_t i = n > kSize ? n - kSize : 0; i < n; ++i) {
    const Slot& s = slots_[i % kSize];
    const std::uint64_t before = s.version.load(std::memory_order_acquire);
    if (before % 2 == 1) continue;  // being rewritten: a newer call is taking the slot
    Collective c;
    c.sequence = s.sequence.load(std::memory_order_relaxed);
    c.count = s.count.load(std::memory_order_relaxed);
    const std::uint32_t packed = s.kind_dtype_op.load(std::memory_order_relaxed);
    c.kind = static_cast<CollectiveKind>(packed & 0xff);
    c.dtype = static_cast<DType>((packed >> 8) & 0xff);
    c.op = static_cast<ReduceOp>((packed >> 16) & 0xff);
    c.root = s.root.load(std::memory_order_relaxed);
    c.tag = s.tag.load(std::memory_order_relaxed);
    const std::int64_t started = s.started_ns.load(std::memory_order_relaxed);
    std::uint8_t state = s.state.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.version.load(std::memory_order_relaxed) != before) continue;  // overwritten while read
    if (state == watched) {
      std::lock_guard lock(watch_mutex_);
      const auto operation = watched_[i % kSize].lock();
      state = !operation || operation->done() ? done : running;
    }
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3f s", static_cast<double>(now - started) / 1e9);
    out.push_back(c.describe() + (state == done ? std::string(": started ") + seconds + " ago, done"
                                                : std::string(": in flight for ") + seconds));
  }
  return out;
}

}  // namespace troupe::collectives::detail
