// Concurrency groups (issue 52, item 2): a control method answers while the default
// group runs a long call; a group of size 2 runs two calls at once; the default group
// stays one at a time; restarts and kills wait for the other lanes.
#include <atomic>
#include <mutex>

#include "actors_fixture.hpp"
#include "troupe/actors/this_call.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Busy {
  // The default group: one call at a time.
  int work(int ms) {
    progress = 0;
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end) {
      if (this_call::cancelled()) break;
      std::this_thread::sleep_for(1ms);
      ++progress;
    }
    return progress.load();
  }
  int crash(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    throw FatalError("broken on purpose");
  }
  // "control": answers while work() runs.
  int status() { return progress.load(); }
  // "io", size 2: two at once.
  int fetch(int ms) {
    const int now = ++fetching;
    {
      std::lock_guard lock(mutex);
      most_fetching = std::max(most_fetching, now);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    --fetching;
    return ms;
  }
  int most_at_once() {
    std::lock_guard lock(mutex);
    return most_fetching;
  }

  std::atomic<int> progress{0};
  std::atomic<int> fetching{0};
  std::mutex mutex;
  int most_fetching = 0;

  static constexpr auto troupe_methods =
      troupe::methods<&Busy::work, &Busy::crash, &Busy::status, &Busy::fetch, &Busy::most_at_once>;
  static constexpr auto troupe_concurrency = troupe::concurrency(
      troupe::group<1, &Busy::status, &Busy::most_at_once>("control"), troupe::group<2, &Busy::fetch>("io"));
};

struct Confused {
  int a() { return 1; }
  static constexpr auto troupe_methods = troupe::methods<&Confused::a>;
  static constexpr auto troupe_concurrency =
      troupe::concurrency(troupe::group<1, &Confused::a>("one"), troupe::group<1, &Confused::a>("two"));
};

}  // namespace

TEST(Concurrency, AControlMethodAnswersWhileTheDefaultGroupWorks) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    auto b = runtime().spawn<Busy>(last_rank());
    auto long_call = b.ask(&Busy::work, 1500);
    std::this_thread::sleep_for(100ms);
    int answered = 0, last = -1;
    while (!long_call.ready()) {
      const auto start = Clock::now();
      const int progress = b.ask(&Busy::status).get();
      EXPECT_LT(seconds_since(start), 0.5) << "status waited behind work";
      EXPECT_GE(progress, last);
      last = progress;
      ++answered;
      std::this_thread::sleep_for(100ms);
    }
    EXPECT_GE(answered, 5) << "status answered only " << answered << " times during a 1.5 s call";
    EXPECT_GT(long_call.get(), 0);
    bool listed = false;
    auto again = b.ask(&Busy::work, 800);
    std::this_thread::sleep_for(100ms);
    auto status = b.ask(&Busy::status);  // runs beside work: both show in the live view
    for (const ActorInfo& a : runtime().actors())
      if (a.rank == b.rank() && a.id == b.id()) {
        listed = true;
        EXPECT_NE(a.running.find("work"), std::string::npos) << a.running;
      }
    EXPECT_TRUE(listed);
    status.get();
    again.get();
  }
  barrier();
}

TEST(Concurrency, AGroupOfTwoRunsTwoCallsAtOnceAndTheDefaultOne) {
  if (runtime().rank() == 0) {
    auto b = runtime().spawn<Busy>(last_rank());
    std::vector<Future<int>> fetches;
    for (int i = 0; i < 4; ++i) fetches.push_back(b.ask(&Busy::fetch, 200));
    when_all(std::move(fetches)).get();
    // Two at once needs two threads: a pool thread and the receiving one.
    EXPECT_EQ(b.ask(&Busy::most_at_once).get(), receives_while_busy() ? 2 : 1)
        << "a group of size 2 ran other than 2 calls at once";
    // The default group: two 300 ms calls take 600 ms, not 300.
    const auto start = Clock::now();
    auto first = b.ask(&Busy::work, 300);
    auto second = b.ask(&Busy::work, 300);
    first.get();
    second.get();
    EXPECT_GE(seconds_since(start), 0.55) << "two calls of the default group overlapped";
  }
  barrier();
}

// Short calls of a group share one lane (Scheduler::lane_for), so a burst of long
// ones after them is first packed there too; the long call hands the rest out.
TEST(Concurrency, LongCallsAfterShortOnesStillRunAtOnce) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    auto b = runtime().spawn<Busy>(last_rank());
    std::vector<Future<int>> quick;
    for (int i = 0; i < 200; ++i) quick.push_back(b.ask(&Busy::fetch, 0));
    when_all(std::move(quick)).get();
    std::vector<Future<int>> slow;
    for (int i = 0; i < 4; ++i) slow.push_back(b.ask(&Busy::fetch, 200));
    when_all(std::move(slow)).get();
    EXPECT_EQ(b.ask(&Busy::most_at_once).get(), 2) << "the long calls ran one after another on one lane";
  }
  barrier();
}

TEST(Concurrency, ACallOfAGroupDoesNotWaitBehindALongOne) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    auto b = runtime().spawn<Busy>(last_rank());
    for (int i = 0; i < 20; ++i) b.ask(&Busy::fetch, 0).get();  // both lanes short so far
    auto long_call = b.ask(&Busy::fetch, 1500);
    std::this_thread::sleep_for(100ms);
    for (int i = 0; i < 10; ++i) {
      const auto start = Clock::now();
      b.ask(&Busy::fetch, 0).get();
      EXPECT_LT(seconds_since(start), 0.5) << "call " << i << " waited behind the long one";
    }
    EXPECT_FALSE(long_call.ready()) << "the long call ended before the short ones were timed";
    long_call.get();
  }
  barrier();
}

TEST(Concurrency, ARestartWaitsForTheOtherGroupsAndKillToo) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    SpawnOptions options;
    options.max_restarts = 3;
    auto b = runtime().spawn_with<Busy>(last_rank(), options);
    auto fetching = b.ask(&Busy::fetch, 400);  // runs through the restart: the object must outlive it
    std::this_thread::sleep_for(50ms);
    EXPECT_THROW(b.ask(&Busy::crash, 10).get(), ActorRestarted);
    EXPECT_EQ(fetching.get(), 400);
    EXPECT_EQ(b.ask(&Busy::status).get(), 0) << "a fresh object after the restart";
    // Control calls keep coming while another restart replaces the object: none may
    // start on a half-built one (ASan and TSan run this).
    std::vector<Future<int>> statuses;
    for (int i = 0; i < 100; ++i) statuses.push_back(b.ask(&Busy::status));
    auto crash = b.ask(&Busy::crash, 1);
    for (int i = 0; i < 100; ++i) statuses.push_back(b.ask(&Busy::status));
    EXPECT_THROW(crash.get(), ActorRestarted);
    for (auto& f : statuses) {
      try {
        EXPECT_GE(f.get(), 0);
      } catch (const ActorRestarted&) {  // queued at the failure, not idempotent: fine
      }
    }
    auto fetching_again = b.ask(&Busy::fetch, 300);
    std::this_thread::sleep_for(50ms);
    runtime().kill(b).get();
    EXPECT_EQ(fetching_again.get(), 300) << "the running call finished before the object went";
    EXPECT_THROW(b.ask(&Busy::status).get(), ActorKilled);
  }
  barrier();
}

TEST(Concurrency, AMethodInTwoGroupsIsRefusedAtSpawn) {
  if (runtime().rank() == 0) {
    try {
      runtime().spawn<Confused>(last_rank());
      ADD_FAILURE() << "an actor with a method in two groups was built";
    } catch (const RemoteError& e) {
      EXPECT_NE(std::string(e.what()).find("more than one concurrency group"), std::string::npos) << e.what();
    }
  }
  barrier();
}

namespace {
// Answers later: relay() asks another actor and returns that Future, so its own
// mailbox goes on (ping answers) while the other works.
struct Relay {
  Future<int> relay(ActorRef<Busy> to, int ms) { return to.ask(&Busy::work, ms); }
  Future<int> relay_crash(ActorRef<Busy> to) { return to.ask(&Busy::crash, 1); }
  Future<void> relay_nothing(ActorRef<Busy> to) {
    return to.ask(&Busy::work, 1).then([](int) {});
  }
  int ping() { return ++pings; }
  int pings = 0;
  static constexpr auto troupe_methods =
      troupe::methods<&Relay::relay, &Relay::relay_crash, &Relay::relay_nothing, &Relay::ping>;
};
}  // namespace

TEST(Concurrency, AMethodThatReturnsAFutureAnswersLaterAndFreesItsMailbox) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    auto busy = runtime().spawn<Busy>(last_rank());
    auto relay = runtime().spawn<Relay>(runtime().size() > 2 ? 1 : 0);
    const auto start = Clock::now();
    Future<int> later = relay.ask(&Relay::relay, busy, 600);
    int pings = 0;
    while (!later.ready() && seconds_since(start) < 0.4) pings = relay.ask(&Relay::ping).get();
    EXPECT_GE(pings, 1) << "the relay's mailbox waited for the answer it relays";
    EXPECT_GT(later.get(), 0);
    relay.ask(&Relay::relay_nothing, busy).get();
    try {
      relay.ask(&Relay::relay_crash, busy).get();
      ADD_FAILURE() << "a relayed failure answered";
    } catch (const RemoteError& e) {
      EXPECT_NE(std::string(e.what()).find("broken on purpose"), std::string::npos) << e.what();
    }
  }
  barrier();
}

namespace {

// Runtime::set_tracer: every call a rank runs while its tracer records is a span on the
// thread that ran it, named for the actor and the method; none once it is unset.
TEST(Concurrency, ATracedRuntimeRecordsEveryCallOnTheThreadThatRanIt) {
  auto tracer = std::make_shared<troupe::Tracer>();
  tracer->start();
  runtime().set_tracer(tracer);
  barrier();
  if (runtime().rank() == 0) {
    auto b = runtime().spawn<Busy>(last_rank());
    std::vector<Future<int>> fetches;
    for (int i = 0; i < 2; ++i) fetches.push_back(b.ask(&Busy::fetch, 50));
    b.ask(&Busy::status).get();
    when_all(std::move(fetches)).get();
    b.ask(&Busy::work, 5).get();
    // A span ends after its answer went out: the next call of the same one-at-a-time
    // group starts only once the first call's span is recorded.
    b.ask(&Busy::work, 0).get();
  }
  barrier();
  runtime().set_tracer(nullptr);
  if (runtime().rank() == last_rank()) {
    std::vector<troupe::TraceSpan> fetches, works, statuses;
    for (auto& span : tracer->take()) {
      EXPECT_EQ(span.category, "actor");
      EXPECT_LE(span.begin_ns, span.end_ns);
      if (span.name.starts_with("Busy #") && span.name.ends_with(".fetch")) fetches.push_back(span);
      if (span.name.ends_with(".work")) works.push_back(span);
      if (span.name.ends_with(".status")) statuses.push_back(span);
    }
    ASSERT_EQ(fetches.size(), 2u);
    EXPECT_GE(works.size(), 1u);
    EXPECT_EQ(statuses.size(), 1u);
    EXPECT_GE(fetches[0].end_ns - fetches[0].begin_ns, 50'000'000) << "a span is the whole call";
    // Spans that overlap ran at once, so on two threads. The "io" group of 2 runs both
    // fetches at once, but on a loaded machine (TSan beside another job) the second may
    // start only after the first: then there is nothing to tell apart.
    const bool overlap = fetches[0].begin_ns < fetches[1].end_ns && fetches[1].begin_ns < fetches[0].end_ns;
    if (overlap) {
      EXPECT_NE(fetches[0].thread, fetches[1].thread);
    }
  }
  barrier();
}

}  // namespace
