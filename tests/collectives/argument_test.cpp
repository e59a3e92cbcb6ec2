// Bad calls throw InvalidArgument on the calling rank before anything is sent, and
// do not use up a sequence number (so the ranks stay in step).
#include <string>

#include "test_world.hpp"
#include "troupe/collectives/single_rank_communicator.hpp"

namespace troupe::collectives::testing {
namespace {

// Runs `call`, expects InvalidArgument whose message contains `part`, and checks that
// no sequence number was spent.
template <class Call>
void expect_rejected(Communicator& comm, Call&& call, const std::string& part) {
  const auto before = comm.next_sequence();
  try {
    call();
    ADD_FAILURE() << "no exception, expected one mentioning '" << part << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  EXPECT_EQ(comm.next_sequence(), before);
}

TEST(ArgumentChecks, RejectAnOutputOfTheWrongSizeNamingBothSizes) {
  std::vector<float> in(4), out(5);
  expect_rejected(
      world(), [&] { world().allreduce(Buffer(in), Buffer(out)); }, "size mismatch, input has 4 elements, output 5");
}

TEST(ArgumentChecks, RejectAnAllgatherOutputThatIsNotSizeTimesTheInput) {
  std::vector<float> in(4), out(4 * world().size() + 1);
  expect_rejected(
      world(), [&] { world().allgather(Buffer(in), Buffer(out)); }, "size mismatch");
}

TEST(ArgumentChecks, RejectACudaBufferGivenToTheMpiBackend) {
  // The pointer is never dereferenced: the device alone decides.
  float fake = 0;
  Buffer on_gpu(&fake, 1, DType::f32, Device::cuda(0));
  expect_rejected(
      world(), [&] { world().allreduce(on_gpu); }, "needs host memory");
}

TEST(ArgumentChecks, RejectMixedDTypes) {
  std::vector<float> in(4);
  std::vector<double> out(4);
  expect_rejected(
      world(), [&] { world().allreduce(Buffer(in), Buffer(out)); }, "input is f32 but output is f64");
}

TEST(ArgumentChecks, RejectAvgOnIntegers) {
  std::vector<std::uint8_t> data(3);
  expect_rejected(
      world(), [&] { world().allreduce(Buffer(data), ReduceOp::avg); }, "avg is not defined on u8");
}

TEST(ArgumentChecks, RejectARootOutsideTheCommunicator) {
  std::vector<float> data(3);
  expect_rejected(
      world(), [&] { world().broadcast(Buffer(data), world().size()); }, "is not a rank");
  expect_rejected(
      world(), [&] { world().reduce(Buffer(data), -1); }, "is not a rank");
}

TEST(ArgumentChecks, RejectANullBufferWithElements) {
  Buffer null(static_cast<float*>(nullptr), 3);
  expect_rejected(
      world(), [&] { world().allreduce(null); }, "null");
}

TEST(ArgumentChecks, RejectSendToARankThatDoesNotExist) {
  std::vector<float> data(3);
  expect_rejected(
      world(), [&] { world().send(Buffer(data), world().size() + 2); }, "peer");
}

TEST(SingleRank, CollectivesAreTheIdentityAndCompleteAtOnce) {
  SingleRankCommunicator one(test_options());
  EXPECT_EQ(one.size(), 1);
  EXPECT_EQ(one.backend(), "single-rank");
  std::vector<float> in{1, 2, 3}, out(3);
  Work work = one.allreduce_async(Buffer(in), Buffer(out), ReduceOp::avg);
  EXPECT_TRUE(work.is_completed());
  EXPECT_EQ(out, in);
  std::vector<float> gathered(3);
  one.allgather(Buffer(in), Buffer(gathered));
  EXPECT_EQ(gathered, in);
  one.reduce_scatter(Buffer(gathered), ReduceOp::prod);
  EXPECT_EQ(gathered, in);
  one.barrier();
  EXPECT_EQ(one.next_sequence(), 4u);
  EXPECT_THROW(one.send(Buffer(in), 0), InvalidArgument);
  EXPECT_NE(one.split(0, 0), nullptr);
  EXPECT_EQ(one.split(-1, 0), nullptr);
}

TEST(SingleRank, IsWhatTheWorldCommunicatorIsForOneRank) {
  auto comm = world_communicator(test_options());
  EXPECT_EQ(comm->size(), world().size());
  EXPECT_EQ(comm->backend(), world().size() == 1 ? "single-rank" : "mpi");
  comm->barrier();
}

}  // namespace
}  // namespace troupe::collectives::testing
