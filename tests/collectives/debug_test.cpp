// Debug mode (Options::debug, TROUPE_DEBUG_COLLECTIVES=1): ranks compare every call.
#include <memory>
#include <string>

#include "test_world.hpp"
#include "troupe/collectives/collective_error.hpp"

namespace troupe::collectives::testing {
namespace {

std::unique_ptr<MpiCommunicator> debug_communicator() {
  Options options = test_options();
  options.debug = true;
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(DebugMode, LetsMatchingCallsThrough) {
  auto comm = debug_communicator();
  std::vector<double> data(7, 1.0);
  comm->allreduce(Buffer(data));
  comm->broadcast(Buffer(data), 0);
  comm->barrier();
  EXPECT_EQ(data[0], comm->size());
  EXPECT_FALSE(comm->failed());
}

TEST(DebugMode, NamesTheRanksWhoseCountDiffers) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  auto comm = debug_communicator();
  const int rank = comm->rank();
  std::vector<float> data(rank == 0 ? 8 : 9, 1.0f);
  std::string message;
  try {
    comm->allreduce(Buffer(data));
  } catch (const CollectiveMismatch& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "no CollectiveMismatch on rank " << rank;
  EXPECT_TRUE(contains(message, "sequence #0")) << message;
  EXPECT_TRUE(contains(message, "rank 0: allreduce #0 (sum, 8 x f32")) << message;
  EXPECT_TRUE(contains(message, "9 x f32")) << message;
  // The ranks are out of step now: the communicator refuses further work.
  EXPECT_TRUE(comm->failed());
  EXPECT_THROW(comm->barrier(), CommunicatorFailed);
}

TEST(DebugMode, NamesDifferentCollectivesAtTheSameSequenceNumber) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  auto comm = debug_communicator();
  comm->barrier();  // sequence 0 agrees
  std::vector<std::int32_t> data(5, 1);
  const bool last = comm->rank() == comm->size() - 1;
  std::string message;
  try {
    if (last) {
      comm->broadcast(Buffer(data), 0);
    } else {
      comm->allreduce(Buffer(data), ReduceOp::max);
    }
  } catch (const CollectiveMismatch& e) {
    message = e.what();
  }
  EXPECT_TRUE(contains(message, "sequence #1")) << message;
  EXPECT_TRUE(contains(message, "broadcast #1 (root 0, 5 x i32")) << message;
  EXPECT_TRUE(contains(message, "allreduce #1 (max, 5 x i32")) << message;
  EXPECT_TRUE(contains(message, "rank " + std::to_string(comm->size() - 1) + ": broadcast")) << message;
}

}  // namespace
}  // namespace troupe::collectives::testing
