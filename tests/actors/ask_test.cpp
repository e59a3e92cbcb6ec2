#include <atomic>
#include <thread>

#include "actors_fixture.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {
// Asks another actor from inside its own method.
struct Relay {
  explicit Relay(ActorRef<Counter> target) : target_(target) {}
  int forward(int x) { return target_.ask(&Counter::add, x).get() + 1000; }
  ActorRef<Counter> target_;
  static constexpr auto troupe_methods = troupe::methods<&Relay::forward>;
};
}  // namespace

TEST(Ask, ReturnsTheMethodsResultFromTheLastRank) {
  if (runtime().rank() == 0) {
    auto counter = runtime().spawn<Counter>(last_rank(), 10);
    EXPECT_EQ(counter.rank(), last_rank());
    EXPECT_EQ(counter.ask(&Counter::add, 5).get(), 15);
    EXPECT_EQ(counter.ask(&Counter::get).get(), 15);
  }
  barrier();
}

TEST(Tell, IsHandledInSendOrderBeforeALaterAsk) {
  if (runtime().rank() == 0) {
    auto counter = runtime().spawn<Counter>(last_rank(), 0);
    for (int i = 0; i < 1000; ++i) counter.tell(&Counter::add, 1);
    counter.tell(&Counter::reset);
    for (int i = 0; i < 7; ++i) counter.tell(&Counter::add, 1);
    EXPECT_EQ(counter.ask(&Counter::get).get(), 7);
  }
  barrier();
}

TEST(Ask, RoundTripsArgumentsOfEveryShape) {
  if (runtime().rank() == 0) {
    auto c = runtime().spawn<Counter>(last_rank());
    EXPECT_EQ(c.ask(&Counter::echo, std::string("héllo, wörld")).get(), "héllo, wörld");
    EXPECT_EQ(c.ask(&Counter::echo, std::string()).get(), "");
    const auto counts = c.ask(&Counter::count, std::vector<std::string>{"a", "b", "a"}).get();
    EXPECT_EQ(counts, (std::map<std::string, int>{{"a", 2}, {"b", 1}}));
    Nested n{"deep", {{{"x", {1, 2, 3}}}, {}}, 1.25};
    Nested expected = n;
    expected.weight = 2.5;
    EXPECT_EQ(c.ask(&Counter::nested, n).get(), expected);
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{64} << 20}) {
      std::vector<char> payload(size);
      for (std::size_t i = 0; i < size; i += 4093) payload[i] = static_cast<char>(i * 7);
      EXPECT_EQ(c.ask(&Counter::bytes, payload).get(), payload) << size << " bytes";
    }
  }
  barrier();
}

TEST(Ask, ManyConcurrentCallersOnOneRankAllGetTheirAnswers) {
  if (runtime().rank() == 0) {
    auto c = runtime().spawn<Counter>(last_rank(), 0);
    constexpr int kThreads = 4, kCalls = 500;
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        int last = 0;
        for (int i = 0; i < kCalls; ++i) {
          const int v = c.ask(&Counter::add, 1).get();
          if (v <= last) ++wrong;  // each caller sees the counter only grow
          last = v;
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_EQ(c.ask(&Counter::get).get(), kThreads * kCalls);
  }
  barrier();
}

TEST(Ask, OrderingHoldsUnderALoadOf100000AsksAcrossRanks) {
  // Every rank pipelines asks to every rank's counter; each sender must see its own
  // answers strictly increase (its messages are handled in send order).
  auto group = runtime().spawn_on_each<Counter>(0);
  const int n = runtime().size();
  const int per_target = 100000 / (n * n);
  int out_of_order = 0;
  for (int target = 0; target < n; ++target) {
    std::vector<Future<int>> answers;
    answers.reserve(static_cast<std::size_t>(per_target));
    for (int i = 0; i < per_target; ++i)
      answers.push_back(group[static_cast<std::size_t>(target)].ask(&Counter::add, 1));
    const std::vector<int> values = when_all(std::move(answers)).get();
    for (std::size_t i = 1; i < values.size(); ++i) out_of_order += values[i] <= values[i - 1];
  }
  EXPECT_EQ(out_of_order, 0);
  barrier();
  EXPECT_EQ(group[static_cast<std::size_t>(runtime().rank())].ask(&Counter::get).get(), per_target * n);
  barrier();
}

TEST(Ask, AMethodMayAskAnotherActorAndWaitWithoutDeadlock) {
  if (runtime().rank() == 0) {
    auto local = runtime().spawn<Counter>(0, 1);
    auto remote = runtime().spawn<Counter>(last_rank(), 2);
    auto relay_to_local = runtime().spawn<Relay>(0, local);  // same rank, one pool thread
    auto relay_to_remote = runtime().spawn<Relay>(last_rank(), local);
    EXPECT_EQ(relay_to_local.ask(&Relay::forward, 1).get(), 1002);
    EXPECT_EQ(relay_to_remote.ask(&Relay::forward, 1).get(), 1003);
    (void)remote;
  }
  barrier();
}

TEST(Future, ThenWhenAllWhenAnyAndTimeouts) {
  if (runtime().rank() == 0) {
    auto c = runtime().spawn<Counter>(last_rank(), 0);
    EXPECT_EQ(c.ask(&Counter::add, 2).then([](int v) { return v * 10; }).get(), 20);
    std::vector<Future<int>> fs;
    for (int i = 0; i < 10; ++i) fs.push_back(c.ask(&Counter::add, 1));
    EXPECT_EQ(when_all(std::move(fs)).get().back(), 12);
    std::vector<Future<int>> race{c.ask(&Counter::slow, 300), runtime().spawn<Counter>(0).ask(&Counter::add, 1)};
    const std::size_t first = when_any(race).get();
    EXPECT_EQ(first, 1u);
    EXPECT_EQ(race[0].get(), 300);
    Future<int> slow = c.ask(&Counter::slow, 300);
    EXPECT_FALSE(slow.ready());
    EXPECT_THROW(slow.get(std::chrono::milliseconds(20)), TimeoutError);
    EXPECT_EQ(slow.get(std::chrono::seconds(10)), 300);  // the answer still arrives
    EXPECT_THROW(slow.get(), InvalidArgument);           // and can be taken once
  }
  barrier();
}
