#include "actors_fixture.hpp"
#include "troupe/actors/detail/serialization.hpp"

#include <cstdlib>
#include <numeric>
#include <stdexcept>

using namespace troupe;
using namespace troupe::test;

namespace {
struct Exploding {
  explicit Exploding(int code) { throw std::runtime_error("boom " + std::to_string(code)); }
  int never() { return 0; }
  static constexpr auto troupe_methods = troupe::methods<&Exploding::never>;
};

template <class F>
RemoteError remote_error_of(F f) {
  try {
    f();
  } catch (const RemoteError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a RemoteError";
  return RemoteError({});
}
}  // namespace

TEST(Errors, AMethodsExceptionArrivesWithTypeMessageRankActorAndMethod) {
  if (runtime().rank() == 0) {
    auto c = runtime().spawn<Counter>(last_rank(), 0);
    const RemoteError e = remote_error_of([&] { c.ask(&Counter::fail, std::string("bad input 42")).get(); });
    EXPECT_EQ(e.code(), actors::ErrorCode::remote_exception);
    EXPECT_EQ(e.rank(), last_rank());
    EXPECT_EQ(e.type(), "std::invalid_argument");
    EXPECT_EQ(e.actor().rfind("Counter #", 0), 0u) << e.actor();  // as written: no namespaces
    EXPECT_EQ(e.method(), "fail");
    const std::string what = e.what();
    EXPECT_NE(what.find("bad input 42"), std::string::npos) << what;
    EXPECT_NE(what.find("[rank " + std::to_string(last_rank()) + ", actor Counter #"), std::string::npos) << what;
    EXPECT_EQ(what.find("troupe::test"), std::string::npos) << what;
    EXPECT_EQ(c.ask(&Counter::add, 1).get(), 1);  // the actor and its rank keep running
  }
  barrier();
}

TEST(Errors, AThrowingConstructorFailsTheSpawn) {
  if (runtime().rank() == 0) {
    const RemoteError e = remote_error_of([] { runtime().spawn<Exploding>(last_rank(), 7); });
    EXPECT_EQ(e.rank(), last_rank());
    EXPECT_EQ(e.method(), "constructor");
    EXPECT_NE(std::string(e.what()).find("boom 7"), std::string::npos) << e.what();
  }
  barrier();
}

TEST(Errors, SpawnOnEachFailsOnEveryRankWhenOneConstructorThrows) {
  EXPECT_THROW(runtime().spawn_on_each<Exploding>(3), RemoteError);
  barrier();
}

struct PickyOnOddRanks {
  static constexpr std::string_view troupe_name = "Picky";
  explicit PickyOnOddRanks(int code) {
    if (runtime().rank() % 2 == 1) throw std::invalid_argument("odd rank, code " + std::to_string(code));
  }
  int never() { return 0; }
  static constexpr auto troupe_methods = troupe::methods<&PickyOnOddRanks::never>;
};

TEST(Errors, SpawnOnEachThrowsOneCollectiveErrorNamingEveryFailedRankOnce) {
  try {
    runtime().spawn_on_each<Exploding>(5);
    ADD_FAILURE() << "spawn_on_each<Exploding> did not throw";
  } catch (const CollectiveError& e) {
    std::vector<int> all(static_cast<std::size_t>(runtime().size()));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(e.failed_ranks(), all);
    const std::string what = e.what();
    // Every rank threw the same: one text, its context once, the actor as written.
    EXPECT_EQ(what.rfind(runtime().size() == 1 ? "spawn failed on rank 0 " : "spawn failed on ranks 0, 1", 0), 0u)
        << what;
    EXPECT_NE(what.find("[actor Exploding, constructor]: std::runtime_error: boom 5"), std::string::npos) << what;
    EXPECT_EQ(what.find("boom 5"), what.rfind("boom 5")) << what;
    EXPECT_EQ(what.find("[rank"), std::string::npos) << what;
  }
  barrier();
  if (runtime().size() < 2) return;
  try {
    runtime().spawn_on_each<PickyOnOddRanks>(9);
    ADD_FAILURE() << "spawn_on_each<PickyOnOddRanks> did not throw";
  } catch (const CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.failed_ranks().front(), 1);
    EXPECT_NE(what.find("[actor Picky, constructor]: std::invalid_argument: odd rank, code 9"), std::string::npos)
        << what;
    // Printed by rank 0 only.
    EXPECT_EQ(print_error("errors_test", e, runtime().rank()), runtime().rank() == 0);
  }
  barrier();
}

TEST(Errors, ActorNamesAreWrittenAsTheProgramWroteThem) {
  using actors::detail::readable_name;
  EXPECT_EQ(readable_name("troupe::train::TrainWorker<(anonymous namespace)::DigitsRecipe>"),
            "TrainWorker<DigitsRecipe>");
  EXPECT_EQ(readable_name("a::Outer<int>::Inner"), "Inner");
  EXPECT_EQ(readable_name("std::map<std::string, ns::V<2> >"), "map<string, V<2> >");
  EXPECT_EQ(actors::detail::actor_name<Counter>(), "Counter");
  EXPECT_EQ(actors::detail::actor_name<PickyOnOddRanks>(), "Picky");
  EXPECT_EQ(actors::detail::unqualified("TrainWorker<A::B>::train_epoch"), "train_epoch");
  // A non-collective error prints on whichever rank holds it.
  EXPECT_TRUE(print_error("errors_test", std::runtime_error("local"), 1));
}

TEST(Errors, AnUnknownActorOrARankOutsideTheWorldIsAClearError) {
  if (runtime().rank() == 0) {
    ActorRef<Counter> ghost(&runtime(), last_rank(), 987654321);
    const RemoteError e = remote_error_of([&] { ghost.ask(&Counter::get).get(); });
    EXPECT_EQ(e.code(), actors::ErrorCode::unknown_actor);
    EXPECT_EQ(e.rank(), last_rank());
    ActorRef<Counter> outside(&runtime(), runtime().size(), 1);
    EXPECT_THROW(outside.ask(&Counter::get), InvalidArgument);
    EXPECT_THROW(outside.tell(&Counter::reset), InvalidArgument);
    EXPECT_THROW(runtime().spawn<Counter>(-1, 0), InvalidArgument);
  }
  barrier();
}

// Checked before MPI is touched, so a second Runtime in this process can try it.
TEST(Errors, ABadLivenessTimeoutFromTheLauncherIsRefusedByName) {
  for (const char* bad : {"soon", "0", "-5", "1e3", "99999999999"}) {
    ::setenv("TROUPE_LIVENESS_TIMEOUT_MS", bad, 1);
    int argc = 0;
    char** argv = nullptr;
    try {
      Runtime second(argc, argv);
      ADD_FAILURE() << "TROUPE_LIVENESS_TIMEOUT_MS=" << bad << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("TROUPE_LIVENESS_TIMEOUT_MS is '") + bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("TROUPE_LIVENESS_TIMEOUT_MS");
}

TEST(Errors, MalformedAndTruncatedMessagesAreReportedAndTheRankKeepsRunning) {
  if (runtime().rank() == 0) {
    auto c = runtime().spawn<Counter>(last_rank(), 5);
    // Raw bytes that are not a message at all: the receiver drops them with a log line.
    runtime().send_raw(last_rank(), "definitely not a troupe message");
    runtime().send_raw(last_rank(), std::string(3, '\x01'));
    // A well-formed header whose arguments are truncated, carry extra bytes, or name
    // a method that does not exist: the caller gets an error saying which.
    auto ask_with = [&](std::uint32_t method, const std::string& args) {
      std::string message = Runtime::new_message() + args;
      auto state = std::make_shared<actors::detail::State<int>>(runtime().progress(), "raw ask");
      runtime().send_request(last_rank(), c.id(), method, message,
                             std::make_shared<actors::detail::TypedReply<int>>("raw ask", state));
      return Future<int>(state);
    };
    std::string good;
    actors::detail::append_serialized(good, std::tuple<int>(3));
    EXPECT_EQ(ask_with(0, good).get(), 8);  // method 0 is add
    RemoteError e = remote_error_of([&] { ask_with(0, good.substr(0, 2)).get(); });
    EXPECT_EQ(e.code(), actors::ErrorCode::bad_message) << e.what();
    e = remote_error_of([&] { ask_with(0, good + "xx").get(); });
    EXPECT_EQ(e.code(), actors::ErrorCode::bad_message) << e.what();
    EXPECT_NE(std::string(e.what()).find("unexpected bytes"), std::string::npos) << e.what();
    e = remote_error_of([&] { ask_with(1000, good).get(); });
    EXPECT_EQ(e.code(), actors::ErrorCode::unknown_method) << e.what();
    // A length prefix announcing far more than arrived (echo's string, count's vector):
    // refused before anything is allocated, where 2^60 bytes would be a bad_alloc.
    std::string forged;
    actors::detail::append_serialized(forged, std::uint64_t{1} << 60);
    forged += "abcd";
    for (std::uint32_t method : {3u, 4u}) {  // echo(std::string), count(std::vector<std::string>)
      e = remote_error_of([&] { ask_with(method, forged).get(); });
      EXPECT_EQ(e.code(), actors::ErrorCode::bad_message) << e.what();
      EXPECT_NE(std::string(e.what()).find("a length of 1152921504606846976 with 4 bytes remaining"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(c.ask(&Counter::get).get(), 8);  // nothing was applied twice or half
  }
  barrier();
}

TEST(Names, ANamedActorIsFoundFromEveryRankAndNamesAreUnique) {
  if (runtime().rank() == 0) runtime().spawn_with<Counter>(last_rank(), {"tally"}, 40);
  barrier();
  auto tally = runtime().lookup<Counter>("tally");
  EXPECT_EQ(tally.rank(), last_rank());
  tally.ask(&Counter::add, 1).get();
  barrier();
  EXPECT_EQ(tally.ask(&Counter::get).get(), 40 + runtime().size());
  EXPECT_EQ(remote_error_of([] { runtime().lookup<Counter>("nobody"); }).code(), actors::ErrorCode::unknown_name);
  EXPECT_THROW(runtime().lookup<Exploding>("tally"), InvalidArgument);  // wrong type
  barrier();
  if (runtime().rank() == 0) {
    const RemoteError e = remote_error_of([] { runtime().spawn_with<Counter>(0, {"tally"}, 0); });
    EXPECT_NE(std::string(e.what()).find("taken"), std::string::npos) << e.what();
  }
  barrier();
}
