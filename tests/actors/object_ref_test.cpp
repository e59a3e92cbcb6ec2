// Object references (issue 52, item 4): values kept where they were made and fetched
// by the rank that needs them, never through the driver.
#include <numeric>

#include "actors_fixture.hpp"
#include "troupe/actors/this_call.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

struct Producer {
  Bytes make(int bytes, int seed) {
    std::vector<std::byte> data(static_cast<std::size_t>(bytes));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
    return Bytes(std::move(data));
  }
  std::vector<int> numbers(int n) {
    std::vector<int> v(static_cast<std::size_t>(n));
    std::iota(v.begin(), v.end(), 1);
    return v;
  }
  Future<int> later(ActorRef<Producer> other, int n) {
    return other.ask(&Producer::numbers, n).then([](std::vector<int> v) { return static_cast<int>(v.size()); });
  }
  std::size_t store_size() { return runtime().object_store_size(); }
  std::size_t spilled_size() { return runtime().object_store_spilled(); }
  static constexpr auto troupe_methods = troupe::methods<&Producer::make, &Producer::numbers, &Producer::later,
                                                         &Producer::store_size, &Producer::spilled_size>;
};

// Holds references as long as it is told to, and hands them on.
struct Holder {
  std::vector<ObjectRef<std::vector<int>>> held;
  void hold(ObjectRef<std::vector<int>> ref) { held.push_back(std::move(ref)); }
  void drop() { held.clear(); }
  ObjectRef<std::vector<int>> echo(ObjectRef<std::vector<int>> ref) { return ref; }
  int total() {
    int sum = 0;
    for (const auto& ref : held) {
      const auto v = ref.get();
      sum += std::accumulate(v.begin(), v.end(), 0);
    }
    return sum;
  }
  // Hands every held reference to `next` and lets go of them: a tell carries the
  // reference (and its weight) from the moment it is sent.
  void pass_to(ActorRef<Holder> next) {
    for (auto& ref : held) next.tell(&Holder::hold, ref);
    held.clear();
  }
  std::size_t store_size() { return this_call::runtime().object_store_size(); }
  static constexpr auto troupe_methods = troupe::methods<&Holder::hold, &Holder::drop, &Holder::echo, &Holder::total,
                                                         &Holder::pass_to, &Holder::store_size>;
};

struct Consumer {
  // Fetches the bytes from wherever they live; returns a checksum.
  long long checksum(ObjectRef<Bytes> ref) {
    const Bytes b = ref.get();
    long long sum = 0;
    for (std::size_t i = 0; i < b.size(); ++i)
      sum += static_cast<long long>(b.data()[i]) * static_cast<long long>(i % 7 + 1);
    return sum;
  }
  int total(ObjectRef<std::vector<int>> ref) {
    const auto v = ref.get();
    return std::accumulate(v.begin(), v.end(), 0);
  }
  static constexpr auto troupe_methods = troupe::methods<&Consumer::checksum, &Consumer::total>;
};

long long expected_checksum(int bytes, int seed) {
  long long sum = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(bytes); ++i)
    sum +=
        static_cast<long long>((i * 131 + static_cast<std::size_t>(seed)) & 0xff) * static_cast<long long>(i % 7 + 1);
  return sum;
}

// Releases travel as messages: the store empties soon after the last reference goes.
template <class Size>
bool store_empties(Size size) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (size() != 0) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

bool small_store() { return runtime().object_store_limit() < (std::size_t{1} << 30); }

}  // namespace

TEST(ObjectRefs, AValueMadeByAnActorIsFetchedByTheRankThatUsesIt) {
  if (small_store()) GTEST_SKIP() << "the small store's run checks refusals only";
  if (runtime().rank() == 0) {
    auto producer = runtime().spawn<Producer>(last_rank());
    auto consumer = runtime().spawn<Consumer>(runtime().size() > 2 ? 1 : 0);
    for (const int bytes : {100, 100000, 3000000}) {  // inline, within the message, attachments of their own
      ObjectRef<Bytes> ref = producer.ask_ref(&Producer::make, bytes, 7).get();
      EXPECT_EQ(ref.rank(), producer.rank()) << "the value stays with its producer";
      EXPECT_EQ(consumer.ask(&Consumer::checksum, ref).get(), expected_checksum(bytes, 7)) << bytes << " bytes";
      EXPECT_EQ(consumer.ask(&Consumer::checksum, ref).get(), expected_checksum(bytes, 7)) << "fetched twice";
      EXPECT_EQ(ref.get().size(), static_cast<std::size_t>(bytes));
      ref.free();
      try {
        (void)ref.get();
        ADD_FAILURE() << "a freed object was fetched";
      } catch (const RemoteError& e) {
        EXPECT_NE(std::string(e.what()).find("freed"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(producer.ask(&Producer::store_size).get(), 0u) << "every object was freed";
    // A method answering later keeps its result too.
    auto helper = runtime().spawn<Producer>(0);
    ObjectRef<int> later = producer.ask_ref(&Producer::later, helper, 5).get();
    EXPECT_EQ(later.get(), 5);
    later.free();
  }
  barrier();
}

TEST(ObjectRefs, PutKeepsAValueOnThisRankForOthersToFetch) {
  if (small_store()) GTEST_SKIP() << "the small store's run checks refusals only";
  if (runtime().rank() == 0) {
    const std::vector<int> numbers{1, 2, 3, 4, 5};
    ObjectRef<std::vector<int>> ref = runtime().put(numbers);
    EXPECT_EQ(ref.rank(), 0);
    EXPECT_GT(runtime().object_store_size(), 0u);
    auto consumer = runtime().spawn<Consumer>(last_rank());
    EXPECT_EQ(consumer.ask(&Consumer::total, ref).get(), 15);
    EXPECT_EQ(ref.get(), numbers);
    ref.free();
    EXPECT_EQ(runtime().object_store_size(), 0u);
  }
  barrier();
}

TEST(ObjectRefs, AFullStoreRefusesNewObjects) {
  if (!small_store()) GTEST_SKIP() << "run with --object-store-limit";
  if (!runtime().object_spill_folder().empty()) GTEST_SKIP() << "this store spills instead";
  if (runtime().rank() == 0) {
    auto producer = runtime().spawn<Producer>(last_rank());
    const int bytes = static_cast<int>(runtime().object_store_limit()) + 1;
    try {
      (void)producer.ask_ref(&Producer::make, bytes, 1).get();
      ADD_FAILURE() << "an object beyond the store's limit was kept";
    } catch (const RemoteError& e) {
      EXPECT_NE(std::string(e.what()).find("object_store_limit"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)runtime().put(std::vector<char>(static_cast<std::size_t>(bytes))), RemoteError);
    EXPECT_EQ(runtime().object_store_size(), 0u);
  }
  barrier();
}

// Run with TROUPE_OBJECT_SPILL_FOLDER and a small store: what does not fit goes to disk
// on the producer's rank, and every rank still fetches the right bytes.
TEST(ObjectRefs, AStoreWithASpillFolderKeepsWhatDoesNotFitOnDisk) {
  if (!small_store() || runtime().object_spill_folder().empty())
    GTEST_SKIP() << "run with --object-store-limit and TROUPE_OBJECT_SPILL_FOLDER";
  if (runtime().rank() == 0) {
    auto producer = runtime().spawn<Producer>(last_rank());
    auto consumer = runtime().spawn<Consumer>(runtime().size() > 2 ? 1 : 0);
    const std::size_t limit = runtime().object_store_limit();
    std::vector<std::pair<ObjectRef<Bytes>, int>> refs;  // and the bytes each holds
    for (int seed = 0; seed < 4; ++seed) {
      const int bytes = static_cast<int>(limit * 6 / 10);
      refs.emplace_back(producer.ask_ref(&Producer::make, bytes, seed).get(), bytes);
    }
    const int huge = static_cast<int>(3 * limit);  // larger than the store may ever hold
    refs.emplace_back(producer.ask_ref(&Producer::make, huge, 9).get(), huge);
    EXPECT_LE(producer.ask(&Producer::store_size).get(), limit);
    EXPECT_GE(producer.ask(&Producer::spilled_size).get(), 3 * limit + 3 * (limit * 6 / 10));
    for (std::size_t i = 0; i < refs.size(); ++i) {
      const int seed = i < 4 ? static_cast<int>(i) : 9;
      EXPECT_EQ(consumer.ask(&Consumer::checksum, refs[i].first).get(), expected_checksum(refs[i].second, seed))
          << "object " << i;
    }
    EXPECT_EQ(refs[0].first.get().size(), static_cast<std::size_t>(refs[0].second)) << "fetched by the driver";
    refs.clear();  // the last references: every object is freed, spilled or not
    EXPECT_TRUE(store_empties(
        [&] { return producer.ask(&Producer::store_size).get() + producer.ask(&Producer::spilled_size).get(); }));
  }
  barrier();
}

TEST(ObjectRefs, AnObjectLivesWhileAnyRankHoldsAReferenceAndNoLonger) {
  if (small_store()) GTEST_SKIP() << "the small store's run checks refusals only";
  if (runtime().rank() == 0) {
    std::vector<ActorRef<Holder>> holders;
    for (int r = 0; r < runtime().size(); ++r) holders.push_back(runtime().spawn<Holder>(r));
    {
      ObjectRef<std::vector<int>> ref = runtime().put(std::vector<int>{1, 2, 3});
      for (auto& h : holders) h.ask(&Holder::hold, ref).get();
    }  // the driver's own reference is gone; the holders keep the object
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_GT(runtime().object_store_size(), 0u);
    for (std::size_t i = 0; i < holders.size(); ++i) {
      EXPECT_EQ(holders[i].ask(&Holder::total).get(), 6) << "holder on rank " << i;
      holders[i].ask(&Holder::drop).get();
      if (i + 1 < holders.size()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        EXPECT_GT(runtime().object_store_size(), 0u) << "freed while " << holders.size() - i - 1 << " holder(s) remain";
      }
    }
    EXPECT_TRUE(store_empties([] { return runtime().object_store_size(); })) << "the last reference was dropped";

    // A value kept by ask_ref on another rank: freed there once this rank lets go.
    auto producer = runtime().spawn<Producer>(last_rank());
    {
      ObjectRef<Bytes> bytes = producer.ask_ref(&Producer::make, 3000000, 1).get();
      EXPECT_GT(producer.ask(&Producer::store_size).get(), 0u);
    }
    EXPECT_TRUE(store_empties([&] { return producer.ask(&Producer::store_size).get(); }));

    // Handed on from rank to rank, the object outlives every hand-off.
    {
      ObjectRef<std::vector<int>> ref = runtime().put(std::vector<int>{4, 5});
      holders.back().ask(&Holder::hold, ref).get();
    }
    for (std::size_t i = holders.size() - 1; i > 0; --i) {
      holders[i].ask(&Holder::pass_to, holders[i - 1]).get();
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (holders[i - 1].ask(&Holder::total).get() != 9 && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the tell is on its way
      EXPECT_EQ(holders[i - 1].ask(&Holder::total).get(), 9) << "after the hand-off to rank " << i - 1;
    }
    holders[0].ask(&Holder::drop).get();
    EXPECT_TRUE(store_empties([] { return runtime().object_store_size(); }));
  }
  barrier();
}

TEST(ObjectRefs, AReferenceSentBackAndForthPinsItsObjectRatherThanLoseIt) {
  if (small_store()) GTEST_SKIP() << "the small store's run checks refusals only";
  if (runtime().rank() == 0) {
    auto echo = runtime().spawn<Holder>(last_rank());
    ObjectRef<std::vector<int>> ref = runtime().put(std::vector<int>{7, 8, 9});
    // Each round trip quarters the weight the reference carries; after about 20 there
    // is none left to split, and the object must stay (pinned) rather than be freed.
    for (int round = 0; round < 40; ++round) ref = echo.ask(&Holder::echo, ref).get();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(echo.ask(&Holder::echo, ref).get().get(), (std::vector<int>{7, 8, 9}));
    ref.free();  // pinned objects are freed by hand
    EXPECT_EQ(runtime().object_store_size(), 0u);
  }
  barrier();
}

TEST(ObjectRefs, ReferencesInsideAStoredValueAreFetchedAsOftenAsWanted) {
  if (small_store()) GTEST_SKIP() << "the small store's run checks refusals only";
  if (runtime().rank() == 0) {
    auto holder = runtime().spawn<Holder>(last_rank());
    ObjectRef<std::vector<int>> inner = runtime().put(std::vector<int>{10, 20});
    ObjectRef<std::vector<ObjectRef<std::vector<int>>>> outer = runtime().put(std::vector{inner, inner});
    inner = {};
    for (int i = 0; i < 3; ++i) {  // each fetch parses the same stored weights again
      for (const auto& ref : outer.get()) holder.ask(&Holder::hold, ref).get();
      EXPECT_EQ(holder.ask(&Holder::total).get(), 60);
      holder.ask(&Holder::drop).get();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto refs = outer.get();
    EXPECT_EQ(refs.at(0).get(), (std::vector<int>{10, 20})) << "an object named in a stored value was freed";
    refs.at(0).free();
    outer.free();
    EXPECT_EQ(runtime().object_store_size(), 0u);
  }
  barrier();
}

TEST(ObjectRefs, TwoRanksFetchLargeObjectsFromEachOtherAtOnce) {
  if (small_store()) GTEST_SKIP() << "the small store's run checks refusals only";
  if (runtime().size() < 2) GTEST_SKIP() << "needs two ranks";
  if (runtime().rank() == 0) {
    // One large message each way (no attachments): each rank's reply waits for the
    // other to take it, so neither may be sent from a receiving thread.
    const int n = 1 << 20;
    ObjectRef<std::vector<int>> here = runtime().put(std::vector<int>(n, 1));
    auto producer = runtime().spawn<Producer>(last_rank());
    auto consumer = runtime().spawn<Consumer>(last_rank());
    ObjectRef<std::vector<int>> there = producer.ask_ref(&Producer::numbers, n).get();
    for (int i = 0; i < 20; ++i) {
      auto theirs = consumer.ask(&Consumer::total, here);
      EXPECT_EQ(there.fetch().get(std::chrono::seconds(30)).size(), static_cast<std::size_t>(n));
      EXPECT_EQ(theirs.get(std::chrono::seconds(30)), n);
    }
  }
  barrier();
}
