#include <atomic>

#include "actors_fixture.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

// Per process: how often a Fragile was constructed, so a test can make one
// particular construction throw.
std::atomic<int> g_constructions{0};
std::atomic<int> g_throw_on_construction{-1};

struct Fragile {
  explicit Fragile(int start) : value(start) {
    if (g_constructions.fetch_add(1) + 1 == g_throw_on_construction.load())
      throw std::runtime_error("constructor refuses this time");
  }
  int add(int x) { return value += x; }
  int get() const { return value; }
  int crash(int sleep_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    throw FatalError("state corrupted on purpose");
  }
  int oops() { throw std::logic_error("an ordinary error"); }
  int restarts() const { return restarted; }
  void arm_constructor_failure(int after) { g_throw_on_construction = g_constructions.load() + after; }
  void on_restart(int count) { restarted = count; }

  int value;
  int restarted = 0;
  static constexpr auto troupe_methods = troupe::methods<&Fragile::add, &Fragile::get, &Fragile::crash, &Fragile::oops,
                                                         &Fragile::restarts, &Fragile::arm_constructor_failure>;
  static constexpr auto troupe_idempotent = troupe::methods<&Fragile::get, &Fragile::restarts>;
};

SpawnOptions restarts(int n) {
  SpawnOptions options;
  options.max_restarts = n;
  return options;
}

template <class E, class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected " << typeid(E).name();
  return {};
}

}  // namespace

TEST(Supervision, AFatalErrorRecreatesTheActorAndCallsOnRestart) {
  if (runtime().rank() == 0) {
    auto f = runtime().spawn_with<Fragile>(last_rank(), restarts(3), 100);
    EXPECT_EQ(f.ask(&Fragile::add, 5).get(), 105);
    const std::string msg = error_of<ActorRestarted>([&] { f.ask(&Fragile::crash, 0).get(); });
    EXPECT_NE(msg.find("state corrupted on purpose"), std::string::npos) << msg;
    EXPECT_NE(msg.find("restart 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("actor Fragile #"), std::string::npos) << msg;
    EXPECT_NE(msg.find(", crash]"), std::string::npos) << msg;
    EXPECT_EQ(f.ask(&Fragile::get).get(), 100);  // a fresh object from the original arguments
    EXPECT_EQ(f.ask(&Fragile::restarts).get(), 1);
    // An ordinary exception fails only its call; the state survives.
    f.ask(&Fragile::add, 1).get();
    EXPECT_THROW(f.ask(&Fragile::oops).get(), RemoteError);
    EXPECT_EQ(f.ask(&Fragile::get).get(), 101);
  }
  barrier();
}

TEST(Supervision, PastItsLimitAnActorIsDeadAndEveryAskFailsAtOnce) {
  if (runtime().rank() == 0) {
    auto f = runtime().spawn_with<Fragile>(last_rank(), restarts(2), 0);
    EXPECT_THROW(f.ask(&Fragile::crash, 0).get(), ActorRestarted);
    EXPECT_THROW(f.ask(&Fragile::crash, 0).get(), ActorRestarted);
    EXPECT_THROW(f.ask(&Fragile::crash, 0).get(), ActorDead);
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = error_of<ActorDead>([&] { f.ask(&Fragile::get).get(); });
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
    EXPECT_NE(msg.find("more than 2 time(s)"), std::string::npos) << msg;
    auto no_restarts = runtime().spawn<Fragile>(last_rank(), 0);
    EXPECT_THROW(no_restarts.ask(&Fragile::crash, 0).get(), ActorDead);
  }
  barrier();
}

TEST(Supervision, CallsQueuedAtTheFailureFailUnlessTheirMethodIsIdempotent) {
  if (runtime().rank() == 0) {
    auto f = runtime().spawn_with<Fragile>(last_rank(), restarts(5), 7);
    f.ask(&Fragile::add, 1).get();
    // Long enough, even on a loaded machine, that the next two arrive and queue behind it.
    auto crash = f.ask(&Fragile::crash, 500);
    auto stale_add = f.ask(&Fragile::add, 1);
    auto redelivered_get = f.ask(&Fragile::get);
    EXPECT_THROW(crash.get(), ActorRestarted);
    if (pool_threads() == 0) {
      // With no pool threads the receiving thread runs the actor itself, so while the
      // crash sleeps nothing more is taken in: the next two are queued at the failure
      // only if they came in the same receive as the crash. On a loaded machine they
      // may not, and then the new object answers both, in order.
      try {
        EXPECT_EQ(stale_add.get(), 8);
        EXPECT_EQ(redelivered_get.get(), 8);
      } catch (const ActorRestarted& e) {
        EXPECT_NE(std::string(e.what()).find("not re-delivered"), std::string::npos) << e.what();
        EXPECT_EQ(redelivered_get.get(), 7);
      }
    } else {
      const std::string msg = error_of<ActorRestarted>([&] { stale_add.get(); });
      EXPECT_NE(msg.find("not re-delivered"), std::string::npos) << msg;
      EXPECT_EQ(redelivered_get.get(), 7);  // handled by the new object, in order
    }
  }
  barrier();
}

TEST(Supervision, CallsThatArriveDuringARestartWaitAndAreAnswered) {
  if (runtime().rank() == 0) {
    SpawnOptions options = restarts(2);
    options.backoff = std::chrono::milliseconds(100);
    auto f = runtime().spawn_with<Fragile>(last_rank(), options, 1);
    auto crash = f.ask(&Fragile::crash, 0);
    EXPECT_THROW(crash.get(), ActorRestarted);
    // The restart holds the actor for 100 ms; this call waits for it, not fails.
    EXPECT_EQ(f.ask(&Fragile::add, 1).get(), 2);
  }
  barrier();
}

TEST(Supervision, AConstructorThatThrowsDuringARestartCountsAsAnotherFailure) {
  if (runtime().rank() == 0) {
    auto f = runtime().spawn_with<Fragile>(last_rank(), restarts(3), 10);
    f.ask(&Fragile::arm_constructor_failure, 1).get();  // the next construction throws
    EXPECT_THROW(f.ask(&Fragile::crash, 0).get(), ActorRestarted);
    EXPECT_EQ(f.ask(&Fragile::get).get(), 10);
    // Two failures (the crash, the constructor) and a successful second attempt.
    EXPECT_EQ(f.ask(&Fragile::restarts).get(), 1);
  }
  barrier();
}

TEST(Supervision, AThousandFatalErrorsLeaveNoCallerUnanswered) {
  if (runtime().rank() == 0) {
    auto f = runtime().spawn_with<Fragile>(last_rank(), restarts(100000), 0);
    // One after another, so that each crash meets a live object: 1,000 real restarts.
    int restarted = 0;
    for (int i = 0; i < 1000; ++i) {
      try {
        f.ask(&Fragile::crash, 0).get(std::chrono::seconds(30));
      } catch (const ActorRestarted&) {
        ++restarted;
      }
    }
    EXPECT_EQ(restarted, 1000);
    EXPECT_EQ(f.ask(&Fragile::restarts).get(), 1000);
    // Pipelined: crashes and adds interleaved; every future resolves, with a value or
    // with ActorRestarted (calls queued behind a crash are stale).
    std::vector<Future<int>> calls;
    for (int i = 0; i < 1000; ++i) {
      calls.push_back(f.ask(&Fragile::crash, 0));
      calls.push_back(f.ask(&Fragile::add, 1));
    }
    int answered = 0;
    for (auto& c : calls) {
      try {
        c.get(std::chrono::seconds(30));
        ++answered;
      } catch (const ActorRestarted&) {
        ++answered;
      }
    }
    EXPECT_EQ(answered, 2000);
  }
  barrier();
}
