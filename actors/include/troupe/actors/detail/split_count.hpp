// A count that one side raises and another lowers -- calls posted by the senders and
// taken by the threads that run them -- kept as two counters on cache lines of their
// own (kApart), so that each side writes only its own line. As one counter, its line
// moved between the sender's and the runner's core on every call: with the lines it
// shared, a third of a local tell's time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace troupe::actors::detail {

// How far apart two variables written by different threads must lie: a cache line
// and its neighbour, which x86's adjacent-line prefetcher fetches as a pair (64
// bytes apart, a sender's counter still stalled on the runner's writes).
inline constexpr std::size_t kApart = 128;

class SplitCount {
 public:
  void add() { added_.fetch_add(1, std::memory_order_seq_cst); }
  void undo_add() { added_.fetch_sub(1, std::memory_order_seq_cst); }
  void remove() { removed_.fetch_add(1, std::memory_order_seq_cst); }
  // Never below the true count at the moment of the call: what was removed is read
  // first, and nothing is removed before it was added.
  std::int64_t value() const {
    const std::int64_t removed = removed_.load(std::memory_order_seq_cst);
    return added_.load(std::memory_order_seq_cst) - removed;
  }

 private:
  alignas(kApart) std::atomic<std::int64_t> added_{0};
  alignas(kApart) std::atomic<std::int64_t> removed_{0};
};

}  // namespace troupe::actors::detail
