// Timeouts: a collective one rank never joins fails on the others with TimeoutError
// within the timeout, naming the collective, its sequence number and size, and fails
// the communicator. Afterwards the late rank joins, so what the others left in flight
// completes inside MPI and the test ends cleanly.
#include <chrono>
#include <memory>
#include <string>

#include "test_world.hpp"
#include "troupe/collectives/collective_error.hpp"

namespace troupe::collectives::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Over MPI alone unless `shared_memory`: only MPI completes a collective that the
// other ranks abandoned once the late rank joins it.
std::unique_ptr<MpiCommunicator> communicator_with_timeout(std::chrono::milliseconds timeout,
                                                           bool shared_memory = false) {
  Options options = test_options();
  options.timeout = timeout;
  options.shared_memory = shared_memory;
  options.direct_blocking_bytes = 0;  // a timeout is an exception only off the fast path (watchdog_main.cpp)
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
}

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Timeout, OfABlockingAllreduceNamesItAndFailsTheCommunicator) {
  if (world().size() < 2) GTEST_SKIP() << "needs a rank that does not come";
  auto comm = communicator_with_timeout(std::chrono::milliseconds(400));
  const bool late = comm->rank() == comm->size() - 1;
  // Static, so alive until exit: after a timeout MPI may still write into an abandoned
  // collective's buffer (and LeakSanitizer sees it reachable).
  static std::vector<float> data(1000, 1.0f);
  if (!late) {
    const auto start = Clock::now();
    std::string message;
    try {
      comm->allreduce(Buffer(data));
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    EXPECT_TRUE(mentions(message, "allreduce #0 (sum, 1000 x f32 = 4000 B) did not complete within 400 ms")) << message;
    EXPECT_GE(waited.count(), 400);
    EXPECT_LT(waited.count(), 5000);
    EXPECT_TRUE(comm->failed());
    // Later calls fail fast instead of hanging.
    const auto again = Clock::now();
    EXPECT_THROW(comm->barrier(), CommunicatorFailed);
    EXPECT_LT(Clock::now() - again, std::chrono::milliseconds(100));
  }
  world().barrier();
  // The late rank completes the others' signature exchange; their allreduce itself
  // never started (MPI's collectives wait for the check), so its own times out too.
  if (late) {
    EXPECT_THROW(comm->allreduce(Buffer(data)), TimeoutError);
  }
  world().barrier();
}

TEST(Timeout, OfAWaitOnAnAsyncHandleIsHonoured) {
  if (world().size() < 2) GTEST_SKIP() << "needs a rank that does not come";
  auto comm = communicator_with_timeout(std::chrono::seconds(60));
  const bool late = comm->rank() == 0;
  static std::vector<std::int64_t> data(10, 1);  // alive until exit, as above
  if (!late) {
    Work work = comm->allreduce_async(Buffer(data));
    const auto start = Clock::now();
    EXPECT_FALSE(work.test());
    try {
      work.wait(std::chrono::milliseconds(200));
      ADD_FAILURE() << "wait returned although rank 0 never joined";
    } catch (const TimeoutError& e) {
      EXPECT_TRUE(mentions(e.what(), "allreduce #0")) << e.what();
      EXPECT_TRUE(mentions(e.what(), "200 ms")) << e.what();
    }
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    EXPECT_TRUE(work.is_completed());  // failed with the communicator
    EXPECT_FALSE(work.is_success());
  }
  world().barrier();
  // The others' allreduce never started (it waited for its signature check), so the
  // late rank's times out as well; its signature exchange completes theirs.
  if (late) {
    EXPECT_THROW(comm->allreduce_async(Buffer(data)).wait(std::chrono::milliseconds(200)), TimeoutError);
  }
  world().barrier();
}

TEST(Timeout, InSharedMemoryNamesTheMissingRankAndTheLateRankIsToldToo) {
  if (world().size() < 2) GTEST_SKIP() << "needs a rank that does not come";
  auto comm = communicator_with_timeout(std::chrono::milliseconds(400), true);
  if (!comm->shared_memory()) GTEST_SKIP() << "the ranks do not share memory here";
  const int late_rank = comm->size() - 1;
  const bool late = comm->rank() == late_rank;
  // Static, so alive until exit: a peer may still read an abandoned collective's slot.
  static std::vector<float> data(1000, 1.0f);
  if (!late) {
    try {
      comm->allreduce(Buffer(data));
      ADD_FAILURE() << "allreduce returned although rank " << late_rank << " never joined";
    } catch (const TimeoutError& e) {
      EXPECT_TRUE(mentions(e.what(), "allreduce #0 (sum, 1000 x f32 = 4000 B) did not complete within 400 ms"))
          << e.what();
      EXPECT_TRUE(mentions(e.what(), "still waiting for rank " + std::to_string(late_rank) + " (shared-memory"))
          << e.what();
    }
  }
  world().barrier();
  // Its peers gave up, so nobody will ever reduce its data: it hears so within its
  // own timeout instead of hanging.
  if (late) {
    EXPECT_THROW(comm->allreduce(Buffer(data)), TimeoutError);
  }
  world().barrier();
}

}  // namespace
}  // namespace troupe::collectives::testing
