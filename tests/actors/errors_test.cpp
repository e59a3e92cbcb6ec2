#include "actors_fixture.hpp"
#include "troupe/actors/detail/serialization.hpp"

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
    EXPECT_NE(e.actor().find("Counter"), std::string::npos);
    EXPECT_EQ(e.method(), "troupe::test::Counter::fail");
    EXPECT_NE(std::string(e.what()).find("bad input 42"), std::string::npos) << e.what();
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
