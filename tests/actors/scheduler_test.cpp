// The scheduler (actors/src/scheduler.hpp): mailboxes drained in batches, calls of
// short-running actors run on the receiving thread, and a pool thread standing in
// for a receiving thread stuck in a long call.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "actors_fixture.hpp"

namespace troupe::test {
namespace {

// Counts the values it was told that came out of order.
struct Sequence {
  void next(int value) {
    if (value != expected) ++out_of_order;
    expected = value + 1;
  }
  int seen() const { return expected; }
  int disorder() const { return out_of_order; }
  int expected = 0;
  int out_of_order = 0;
  static constexpr auto troupe_methods = troupe::methods<&Sequence::next, &Sequence::seen, &Sequence::disorder>;
};

}  // namespace

TEST(Scheduler, LongBurstsOfTellsKeepSendOrderAcrossRanksAndWithinARank) {
  if (runtime().rank() == 0) {
    constexpr int kTells = 50000;
    for (int rank : {last_rank(), 0}) {
      auto sequence = runtime().spawn<Sequence>(rank);
      for (int i = 0; i < kTells; ++i) sequence.tell(&Sequence::next, i);
      EXPECT_EQ(sequence.ask(&Sequence::seen).get(), kTells) << "to rank " << rank;
      EXPECT_EQ(sequence.ask(&Sequence::disorder).get(), 0) << "to rank " << rank;
    }
  }
  barrier();
}

TEST(Scheduler, ALongCallDoesNotStopItsRankReceivingForOtherActors) {
  if (pool_threads() == 0) GTEST_SKIP() << "without pool threads a long call holds the only thread (documented)";
  if (runtime().rank() == 0) {
    auto slow = runtime().spawn<Counter>(last_rank(), 0);
    auto quick = runtime().spawn<Counter>(last_rank(), 0);
    for (int i = 0; i < 10; ++i) slow.ask(&Counter::add, 1).get();  // short calls: it runs where it is received
    auto long_call = slow.ask(&Counter::slow, 1500);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(quick.ask(&Counter::add, 5).get(), 5);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
    EXPECT_EQ(long_call.get(), 1500);
    EXPECT_EQ(slow.ask(&Counter::get).get(), 10);  // and the slow actor goes on answering
  }
  barrier();
}

TEST(Scheduler, AQueueDepthReadWhileCallsComeAndGoIsNeverNegative) {
  // SplitCount (the depth behind live state and mailbox_capacity) reads what was taken
  // before what was posted; read the other way round, a reader between its two loads
  // saw more calls taken than posted. Here each call is taken right after it is
  // posted, so the depth is 0 or 1 while both counters move all the time.
  if (runtime().rank() == 0) {
    actors::detail::SplitCount depth;
    std::atomic<bool> done{false};
    std::atomic<bool> reading{false};
    std::int64_t lowest = 0;
    std::thread reader([&] {
      reading = true;
      while (!done.load()) lowest = std::min(lowest, depth.value());
    });
    while (!reading.load()) std::this_thread::yield();
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < end) {
      for (int i = 0; i < 1000; ++i) {
        depth.add();
        depth.remove();
      }
    }
    done = true;
    reader.join();
    EXPECT_GE(lowest, 0);
    EXPECT_EQ(depth.value(), 0);
  }
  barrier();
}

}  // namespace troupe::test
