// Cancellation, deadlines, kill and the live view of actors (issue 52, items 1 and 5).
// Rank 0 drives; the actor lives on the last rank, so at 1 rank every path is the
// local one and at 2 and 4 ranks the remote one.
#include <atomic>

#include "actors_fixture.hpp"
#include "troupe/actors/this_call.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

using namespace std::chrono_literals;
using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Per process: calls of Sleeper::work that ran (started), so a test can tell a call
// that was dropped from one that ran.
std::atomic<int> g_started{0};

struct Sleeper {
  // Sleeps `ms` in 1 ms steps, ignoring cancellation; returns ms.
  int nap(int ms) {
    ++g_started;
    std::this_thread::sleep_for(Ms(ms));
    return ms;
  }
  // Works up to `ms`, giving up when cancelled; returns the steps done.
  int work(int ms) {
    ++g_started;
    const auto end = Clock::now() + Ms(ms);
    int steps = 0;
    while (Clock::now() < end) {
      this_call::throw_if_cancelled();
      std::this_thread::sleep_for(Ms(1));
      ++steps;
    }
    return steps;
  }
  // Whether the call saw itself cancelled within `ms` (it keeps going either way).
  bool notices(int ms) {
    const auto end = Clock::now() + Ms(ms);
    while (Clock::now() < end) {
      if (this_call::cancelled()) return true;
      std::this_thread::sleep_for(Ms(1));
    }
    return false;
  }
  // The deadline this call carries, as milliseconds left (-1: none).
  long long deadline_left_ms() {
    const auto d = this_call::deadline();
    return d ? std::chrono::duration_cast<Ms>(*d - Clock::now()).count() : -1;
  }
  int started() const { return g_started.load(); }
  // Stands in for a method that runs a collective.
  int all_reduce(int x) { return x; }

  static constexpr auto troupe_methods =
      troupe::methods<&Sleeper::nap, &Sleeper::work, &Sleeper::notices, &Sleeper::deadline_left_ms, &Sleeper::started,
                      &Sleeper::all_reduce>;
  static constexpr auto troupe_collective = troupe::methods<&Sleeper::all_reduce>;
};

}  // namespace

TEST(Cancel, AQueuedCallIsDroppedAndItsAskerToldAtOnce) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    auto s = runtime().spawn<Sleeper>(last_rank());
    const int before = s.ask(&Sleeper::started).get();
    auto busy = s.ask(&Sleeper::nap, 1500);
    auto queued = s.ask(&Sleeper::nap, 10);
    std::this_thread::sleep_for(50ms);  // the nap has begun; the second call waits behind it
    const auto start = Clock::now();
    queued.cancel();
    try {
      queued.get();
      ADD_FAILURE() << "a cancelled queued call answered";
    } catch (const Cancelled& e) {
      EXPECT_EQ(e.code(), actors::ErrorCode::cancelled);
      EXPECT_EQ(e.method(), "nap");
      EXPECT_NE(std::string(e.what()).find("before it started"), std::string::npos) << e.what();
    }
    EXPECT_LT(seconds_since(start), 1.0) << "the cancel waited for the busy call";
    EXPECT_EQ(busy.get(), 1500);
    EXPECT_EQ(s.ask(&Sleeper::started).get(), before + 1) << "the cancelled call ran";
    queued.cancel();  // resolved already: nothing happens
  }
  barrier();
}

TEST(Cancel, ARunningMethodThatPollsGivesUp) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    auto s = runtime().spawn<Sleeper>(last_rank());
    auto running = s.ask(&Sleeper::work, 20000);
    std::this_thread::sleep_for(50ms);
    const auto start = Clock::now();
    cancel(running);
    EXPECT_THROW(running.get(), Cancelled);
    EXPECT_LT(seconds_since(start), 5.0);
    EXPECT_EQ(s.ask(&Sleeper::nap, 1).get(), 1) << "the actor goes on after a cancelled call";
  }
  barrier();
}

TEST(Cancel, AMethodThatIgnoresTheTokenStillAnswers) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    auto s = runtime().spawn<Sleeper>(last_rank());
    auto watching = s.ask(&Sleeper::notices, 3000);
    std::this_thread::sleep_for(50ms);
    watching.cancel();
    EXPECT_TRUE(watching.get()) << "the method never saw this_call::cancelled()";
    auto ignoring = s.ask(&Sleeper::nap, 200);
    std::this_thread::sleep_for(50ms);
    ignoring.cancel();
    EXPECT_EQ(ignoring.get(), 200) << "the work was done, so its answer comes";
    auto untouched = s.ask(&Sleeper::notices, 100);
    EXPECT_FALSE(untouched.get());
  }
  barrier();
}

TEST(Cancel, DerivedFuturesCancelTheirInputs) {
  if (runtime().rank() == 0) {
    auto s = runtime().spawn<Sleeper>(last_rank());
    auto busy = s.ask(&Sleeper::nap, 600);
    std::this_thread::sleep_for(20ms);
    auto doubled = s.ask(&Sleeper::nap, 10).then([](int v) { return 2 * v; });
    std::vector<Future<int>> pair;
    pair.push_back(s.ask(&Sleeper::nap, 10));
    pair.push_back(s.ask(&Sleeper::nap, 10));
    auto both = when_all(std::move(pair));
    doubled.cancel();
    both.cancel();
    EXPECT_THROW(doubled.get(), Cancelled);
    EXPECT_THROW(both.get(), Cancelled);
    EXPECT_EQ(busy.get(), 600);
  }
  barrier();
}

TEST(Cancel, CollectiveMethodsRefuseCancelAndDeadlines) {
  if (runtime().rank() == 0) {
    auto s = runtime().spawn<Sleeper>(last_rank());
    auto call = s.ask(&Sleeper::all_reduce, 3);
    try {
      call.cancel();
      if (!call.ready()) ADD_FAILURE() << "cancel of a collective method was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("troupe_collective"), std::string::npos) << e.what();
    }
    EXPECT_EQ(call.get(), 3);
    try {
      (void)s.ask(Deadline::in(1s), &Sleeper::all_reduce, 1);
      ADD_FAILURE() << "a deadline on a collective method was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
    }
    Promise<int> promise;
    EXPECT_THROW(promise.get_future().cancel(), InvalidArgument);
  }
  barrier();
}

TEST(Deadline, AnExpiredCallIsNotStarted) {
  if (!receives_while_busy()) GTEST_SKIP() << "the deadline counts from arrival, which waits for the busy call";
  if (runtime().rank() == 0) {
    auto s = runtime().spawn<Sleeper>(last_rank());
    const int before = s.ask(&Sleeper::started).get();
    auto busy = s.ask(&Sleeper::nap, 500);
    auto late = s.ask(Deadline::in(50ms), &Sleeper::nap, 10);
    auto past = s.ask(Deadline{Clock::now() - 1s}, &Sleeper::nap, 10);
    // Not waited on: the callee itself refuses them when their turn comes, before it
    // answers the ask behind them (a waiter would stop at the deadline by itself).
    EXPECT_EQ(busy.get(), 500);
    EXPECT_EQ(s.ask(&Sleeper::started).get(), before + 1) << "an expired call ran";
    for (auto* f : {&late, &past}) {
      ASSERT_TRUE(f->ready());
      try {
        (void)f->get();
        ADD_FAILURE() << "a call past its deadline answered";
      } catch (const DeadlineExceeded& e) {
        EXPECT_NE(std::string(e.what()).find("before it could start"), std::string::npos) << e.what();
      }
    }
  }
  barrier();
}

TEST(Deadline, AWaiterStopsAtTheDeadlineAndTheCallIsCancelled) {
  if (runtime().rank() == 0) {
    auto s = runtime().spawn<Sleeper>(last_rank());
    auto busy = s.ask(&Sleeper::nap, 1000);
    auto late = s.ask(Deadline::in(100ms), &Sleeper::nap, 10);
    const auto start = Clock::now();
    EXPECT_THROW(late.get(), DeadlineExceeded);
    EXPECT_LT(seconds_since(start), 0.9) << "get() waited past the call's deadline";
    EXPECT_EQ(busy.get(), 1000);
  }
  barrier();
}

TEST(Deadline, TheMethodSeesItsDeadline) {
  if (runtime().rank() == 0) {
    auto s = runtime().spawn<Sleeper>(last_rank());
    const long long left = s.ask(Deadline::in(5s), &Sleeper::deadline_left_ms).get();
    EXPECT_GT(left, 3000);
    EXPECT_LE(left, 5000);
    EXPECT_EQ(s.ask(&Sleeper::deadline_left_ms).get(), -1);
    if (receives_while_busy()) {
      auto slow = s.ask(Deadline::in(100ms), &Sleeper::work, 20000);
      EXPECT_THROW(slow.get(10s), DeadlineExceeded);
    }
  }
  barrier();
}

TEST(Kill, QueuedAndLaterCallsFailAndTheActorIsGone) {
  if (!receives_while_busy()) GTEST_SKIP() << "no pool thread receives while a method runs";
  if (runtime().rank() == 0) {
    SpawnOptions restartable;
    restartable.max_restarts = 3;  // a kill is not a failure: no restart
    auto s = runtime().spawn_with<Sleeper>(last_rank(), restartable);
    auto running = s.ask(&Sleeper::notices, 3000);
    std::this_thread::sleep_for(50ms);
    auto queued = s.ask(&Sleeper::nap, 10);
    runtime().kill(s).get();
    try {
      queued.get();
      ADD_FAILURE() << "a call queued at a kill ran";
    } catch (const ActorKilled& e) {
      EXPECT_NE(std::string(e.what()).find("Runtime::kill from rank 0"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(running.get()) << "the running call was not told";
    EXPECT_THROW(s.ask(&Sleeper::nap, 1).get(), ActorKilled);
    EXPECT_THROW(s.ask(&Sleeper::nap, 1).get(), ActorDead);  // a kind of dead
    runtime().kill(s).get();                                 // again: nothing to do
    bool listed = false;
    for (const ActorInfo& a : runtime().actors())
      if (a.rank == s.rank() && a.id == s.id()) {
        listed = true;
        EXPECT_EQ(a.state, "killed");
      }
    EXPECT_TRUE(listed);
  }
  barrier();
}

TEST(LiveState, EveryRankListsItsActorsWithWhatTheyRun) {
  const auto group = runtime().spawn_on_each<Sleeper>();
  if (runtime().rank() == 0) {
    SpawnOptions named;
    named.name = "sleeper-" + std::to_string(runtime().size());
    auto s = runtime().spawn_with<Sleeper>(last_rank(), named);
    auto busy = s.ask(&Sleeper::nap, 800);
    auto waiting = s.ask(&Sleeper::nap, 1);
    std::this_thread::sleep_for(200ms);
    const std::vector<ActorInfo> all = runtime().actors();
    const bool seen_busy = receives_while_busy();
    std::vector<int> group_ranks;
    const ActorInfo* mine = nullptr;
    for (const ActorInfo& a : all) {
      if (a.id == group[0].id()) group_ranks.push_back(a.rank);
      if (a.rank == s.rank() && a.id == s.id()) mine = &a;
    }
    std::vector<int> expected;
    for (int r = 0; r < runtime().size(); ++r) expected.push_back(r);
    EXPECT_EQ(group_ranks, expected) << "the group's members, in rank order";
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(mine->type, "Sleeper");
    EXPECT_EQ(mine->name, named.name);
    EXPECT_EQ(mine->state, "alive");
    if (seen_busy) {
      EXPECT_EQ(mine->running, "nap");
      EXPECT_GT(mine->running_for_s, 0.1);
      EXPECT_EQ(mine->mailbox_depth, 1u);
      EXPECT_EQ(mine->calls_served, 0u);
    }
    busy.get();
    waiting.get();
    // The answer leaves before the lane is marked idle and counted: wait (bounded) for it.
    ActorInfo after;
    for (const auto until = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < until;) {
      for (const ActorInfo& a : runtime().actors())
        if (a.rank == s.rank() && a.id == s.id()) after = a;
      if (after.calls_served == 2u && after.running.empty()) break;
      std::this_thread::sleep_for(5ms);
    }
    EXPECT_EQ(after.running, "");
    EXPECT_EQ(after.calls_served, 2u);
    EXPECT_EQ(after.mailbox_depth, 0u);
  }
  barrier();
}
