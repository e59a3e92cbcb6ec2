// Object references (issue 52, item 4): values kept where they were made and fetched
// by the rank that needs them, never through the driver.
#include <numeric>

#include "actors_fixture.hpp"

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
  static constexpr auto troupe_methods =
      troupe::methods<&Producer::make, &Producer::numbers, &Producer::later, &Producer::store_size>;
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
