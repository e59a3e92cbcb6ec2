// Small blocking calls whose counts differ (issue 49, part 7): rank 0 all-reduces 1000
// floats and the last rank 1001. Across nodes such a call travels packed, its signature
// in the same message as its data (packed_route.hpp), so the messages themselves differ
// in size; on one node it travels on the signature board (board_route.hpp). Either way
// every rank must throw CollectiveMismatch naming both calls, within seconds -- not
// MPI_ERR_TRUNCATE on one rank while the other waits for ever.
//
// CTest runs these at 2 ranks over `--mca btl self,tcp` and `self,vader`
// (collectives_count_mismatch_*); they run in collectives_np* too.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "test_world.hpp"
#include "troupe/collectives/collective_error.hpp"

namespace troupe::collectives::testing {
namespace {

struct Route {
  const char* name;
  bool shared_memory;  // off: the packed MPI call; on: the board
};

class CountMismatch : public ::testing::TestWithParam<Route> {
 protected:
  void SetUp() override {
    if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  }

  // Runs `call(comm, deviate)` on a fresh communicator, the last rank deviating, and
  // checks that every rank threw CollectiveMismatch naming `usual` (the other ranks'
  // call) and `deviant` on the last rank, well within the communicator's timeout.
  void expect_named(const std::function<void(Communicator&, bool)>& call, const std::string& usual,
                    const std::string& deviant) {
    Options options = test_options();
    options.timeout = std::chrono::seconds(20);  // a hang in MPI: the watchdog aborts the job
    options.shared_memory = GetParam().shared_memory;
    MpiCommunicator comm(MPI_COMM_WORLD, options);
    const int last = comm.size() - 1;
    std::string message;
    const auto start = std::chrono::steady_clock::now();
    try {
      call(comm, comm.rank() == last);
    } catch (const CollectiveMismatch& e) {
      message = e.what();
    }
    const auto took = std::chrono::steady_clock::now() - start;
    SCOPED_TRACE(std::string(GetParam().name) + ", rank " + std::to_string(comm.rank()));
    ASSERT_FALSE(message.empty()) << "no CollectiveMismatch";
    EXPECT_LT(took, std::chrono::seconds(5));
    EXPECT_NE(message.find("collective mismatch at sequence #0"), std::string::npos) << message;
    EXPECT_NE(message.find(": " + usual), std::string::npos) << message;  // "rank 0" or "ranks 0,1"
    EXPECT_NE(message.find("rank " + std::to_string(last) + ": " + deviant), std::string::npos) << message;
    EXPECT_TRUE(comm.failed());
  }
};

TEST_P(CountMismatch, AnAllreduceOf1000And1001FloatsFailsEveryRank) {
  expect_named(
      [](Communicator& comm, bool deviate) {
        std::vector<float> data(deviate ? 1001 : 1000, 1.0f);
        comm.allreduce(Buffer(data));
      },
      "allreduce #0 (sum, 1000 x f32", "allreduce #0 (sum, 1001 x f32");
}

TEST_P(CountMismatch, AnAllreduceOfOneMoreElementFailsEveryRank) {
  expect_named(
      [](Communicator& comm, bool deviate) {
        std::vector<double> data(deviate ? 2 : 1, 1.0);
        comm.allreduce(Buffer(data), ReduceOp::max);
      },
      "allreduce #0 (max, 1 x f64", "allreduce #0 (max, 2 x f64");
}

TEST_P(CountMismatch, AnAllgatherOfAnotherCountFailsEveryRank) {
  expect_named(
      [](Communicator& comm, bool deviate) {
        const std::size_t count = deviate ? 4 : 3;
        std::vector<float> in(count, 1.0f), out(count * static_cast<std::size_t>(comm.size()));
        comm.allgather(Buffer(in), Buffer(out));
      },
      "allgather #0 (3 x f32", "allgather #0 (4 x f32");
}

TEST_P(CountMismatch, AReduceScatterOfAnotherCountFailsEveryRank) {
  expect_named(
      [](Communicator& comm, bool deviate) {
        const std::size_t count = deviate ? 5 : 6;
        std::vector<float> in(count * static_cast<std::size_t>(comm.size()), 1.0f), out(count);
        comm.reduce_scatter(Buffer(in), Buffer(out));
      },
      "reduce_scatter #0 (sum, 6 x f32", "reduce_scatter #0 (sum, 5 x f32");
}

// A broadcast's ranks compare the root's signature with their own: the rank that
// differs fails; the root is not told (packed_route.hpp, board_route.hpp), and other
// ranks get the root's data (packed) or see the mismatch too (on the board, which
// shows them every entry). The last rank expects one element more, then one fewer,
// than the root sends.
TEST_P(CountMismatch, ABroadcastOfAnotherCountFailsTheRankThatDiffers) {
  for (std::size_t deviant : {101, 99}) {
    Options options = test_options();
    options.timeout = std::chrono::seconds(20);
    options.shared_memory = GetParam().shared_memory;
    MpiCommunicator comm(MPI_COMM_WORLD, options);
    const bool deviate = comm.rank() == comm.size() - 1;
    std::vector<float> data(deviate ? deviant : 100, comm.rank() == 0 ? 7.0f : 0.0f);
    if (!deviate) {
      try {
        comm.broadcast(Buffer(data), 0);
        EXPECT_EQ(data[99], 7.0f);
      } catch (const CollectiveMismatch&) {
        EXPECT_TRUE(GetParam().shared_memory && comm.rank() != 0) << "rank " << comm.rank();
      }
      continue;
    }
    std::string message;
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.broadcast(Buffer(data), 0);
    } catch (const CollectiveMismatch& e) {
      message = e.what();
    }
    SCOPED_TRACE(std::string(GetParam().name) + ", " + std::to_string(deviant) + " floats");
    ASSERT_FALSE(message.empty()) << "no CollectiveMismatch";
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_NE(message.find(": broadcast #0 (root 0, 100 x f32"), std::string::npos) << message;
    EXPECT_NE(message.find(": broadcast #0 (root 0, " + std::to_string(deviant) + " x f32"), std::string::npos)
        << message;
    EXPECT_TRUE(comm.failed());
  }
}

// Before and after: calls that agree still give their results on the same communicator
// kinds (sizes up to the packed limit, 4 KB, and one past it).
TEST_P(CountMismatch, MatchingCallsOfEverySmallSizeStillAgree) {
  Options options = test_options();
  options.shared_memory = GetParam().shared_memory;
  MpiCommunicator comm(MPI_COMM_WORLD, options);
  const auto n = static_cast<float>(comm.size());
  for (std::size_t count : {0, 1, 3, 1000, 1001, 1024, 1025}) {
    std::vector<float> data(count, 1.0f);
    comm.allreduce(Buffer(data));
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], n) << count << " floats, element " << i;
  }
  EXPECT_FALSE(comm.failed());
}

std::string route_name(const ::testing::TestParamInfo<Route>& info) {
  return info.param.shared_memory ? "Board" : "Packed";
}

INSTANTIATE_TEST_SUITE_P(Routes, CountMismatch,
                         ::testing::Values(Route{"packed MPI call", false}, Route{"signature board", true}),
                         route_name);

}  // namespace
}  // namespace troupe::collectives::testing
