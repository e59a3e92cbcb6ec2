// Async forms: handles that overlap, test() without blocking, waits with a timeout,
// and handles dropped before completion.
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "test_world.hpp"

namespace troupe::collectives::testing {
namespace {

TEST(AsyncCollectives, OverlapAndEachDeliversItsOwnResult) {
  Communicator& comm = world();
  const int size = comm.size(), rank = comm.rank();
  // Mixed kinds and sizes in flight together, one of them large enough for the ring.
  const std::vector<std::size_t> sizes{1, 7, 1023, 300000, 5};
  std::vector<Data> sums;
  std::vector<Work> works;
  for (std::size_t n : sizes) {
    sums.push_back(input_of(Pattern::mixed, DType::f32, rank, n));
  }
  for (auto& d : sums) works.push_back(comm.allreduce_async(d.buffer()));
  Data bcast = input_of(Pattern::mixed, DType::i64, rank, 1000);
  works.push_back(comm.broadcast_async(bcast.buffer(), size - 1));
  Data mine = input_of(Pattern::mixed, DType::bf16, rank, 33);
  Data gathered(DType::bf16, 33 * static_cast<std::size_t>(size));
  works.push_back(comm.allgather_async(mine.buffer(), gathered.buffer()));
  // Sequence numbers follow call order.
  for (std::size_t i = 1; i < works.size(); ++i) EXPECT_EQ(works[i].sequence(), works[i - 1].sequence() + 1);
  // Waiting in reverse order completes the earlier ones too.
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
  for (auto& w : works) EXPECT_TRUE(w.is_success());
  for (auto& d : sums) {
    EXPECT_EQ(compare(d, [&](std::size_t i) { return reduced(ReduceOp::sum, Pattern::mixed, DType::f32, size, i); }),
              "");
  }
  EXPECT_EQ(compare(bcast, [&](std::size_t i) { return value(Pattern::mixed, DType::i64, size - 1, i); }), "");
  EXPECT_EQ(
      compare(gathered,
              [&](std::size_t i) { return value(Pattern::mixed, DType::bf16, static_cast<int>(i / 33), i % 33); }),
      "");
}

TEST(AsyncCollectives, TestReportsCompletionWithoutBlocking) {
  Data data = input_of(Pattern::mixed, DType::f64, world().rank(), 4096);
  Work work = world().allreduce_async(data.buffer(), ReduceOp::max);
  while (!work.test()) {
  }
  EXPECT_TRUE(work.is_completed());
  EXPECT_TRUE(work.is_success());
  EXPECT_EQ(work.exception(), nullptr);
  EXPECT_NO_THROW(work.wait(std::chrono::milliseconds(1)));
  EXPECT_EQ(
      compare(data,
              [&](std::size_t i) { return reduced(ReduceOp::max, Pattern::mixed, DType::f64, world().size(), i); }),
      "");
}

TEST(AsyncCollectives, ADroppedHandleStillCompletesAndTheCommunicatorGoesOn) {
  Data data = input_of(Pattern::mixed, DType::i32, world().rank(), 100000);
  { Work dropped = world().allreduce_async(data.buffer()); }  // no terminate, no cancel
  world().barrier();                                          // waiting drives everything in flight, in order
  EXPECT_EQ(
      compare(data,
              [&](std::size_t i) { return reduced(ReduceOp::sum, Pattern::mixed, DType::i32, world().size(), i); }),
      "");
}

// A tensor dropped while its allreduce runs: the collective holds the storage until it
// completes (the ASan run would report the write into freed memory otherwise), then
// lets it go.
TEST(AsyncCollectives, ATensorDroppedMidFlightLivesUntilItsCollectiveCompletes) {
  Communicator& comm = world();
  tensor::Tensor t = tensor::Tensor::ones({1 << 16}, DType::f32);
  const std::weak_ptr<tensor::Storage> storage = t.storage();
  // The last rank joins late, so on the others the allreduce is still in flight.
  if (comm.rank() == comm.size() - 1 && comm.size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Work work = comm.allreduce_async(Buffer(t));
  t = tensor::Tensor();
  EXPECT_FALSE(storage.expired());
  work.wait();
  EXPECT_TRUE(work.is_success());
  work = Work();
  comm.barrier();  // the engine has let go of the finished operation by now
  EXPECT_TRUE(storage.expired());
}

// A host collective has no device stream to wait on: wait_on_device() says so and
// leaves it to wait(), which blocks only while it is unfinished (host_waits counts that).
TEST(AsyncCollectives, AHostCollectiveCannotBeWaitedOnByADevice) {
  Communicator& comm = world();
  Data big = input_of(Pattern::mixed, DType::f32, comm.rank(), 300000);
  Work work = comm.allreduce_async(big.buffer());
  const std::uint64_t before = comm.host_waits();
  const bool done_early = work.is_completed();
  if (!done_early) {
    EXPECT_FALSE(work.wait_on_device());
  }
  work.wait();
  EXPECT_TRUE(work.wait_on_device()) << "nothing left to wait for once it is done";
  EXPECT_LE(comm.host_waits() - before, 1u);
  EXPECT_TRUE(Work().wait_on_device());
}

TEST(AsyncCollectives, ADefaultWorkIsAlreadyComplete) {
  Work none;
  EXPECT_TRUE(none.test());
  EXPECT_TRUE(none.is_success());
  EXPECT_NO_THROW(none.wait());
}

TEST(AsyncCollectives, DescribeNamesTheCollectiveItsSequenceAndSize) {
  Data data(DType::bf16, 1023);
  Work work = world().allreduce_async(data.buffer(), ReduceOp::sum);
  const std::string text = work.describe();
  work.wait();
  EXPECT_NE(text.find("allreduce #" + std::to_string(work.sequence())), std::string::npos) << text;
  EXPECT_NE(text.find("1023 x bf16"), std::string::npos) << text;
}

}  // namespace
}  // namespace troupe::collectives::testing
