// Which route carries a call (collectives/src/route.hpp): the table of
// docs/COLLECTIVES.md, asked of real communicators. The collectives themselves are
// tested along every route by the other files of this binary.
#include <string>
#include <vector>

#include "test_world.hpp"

namespace troupe::collectives::testing {
namespace {

// A call of `count` f32 per rank; only its signature and buffer sizes are read.
struct Call {
  std::vector<float> in, out;
  Collective c;
  Call(CollectiveKind kind, std::size_t count, std::size_t out_count, int size) : in(count), out(out_count) {
    c.kind = kind;
    c.count = count;
    c.input = Buffer(in);
    c.output = Buffer(out);
    c.root = size - 1;
  }
};

std::string route(MpiCommunicator& comm, CollectiveKind kind, std::size_t count, bool blocking) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  const std::size_t out = kind == CollectiveKind::allgather ? count * n : count;
  const std::size_t in = kind == CollectiveKind::reduce_scatter ? count * n : count;
  Call call(kind, in, out, comm.size());
  call.c.count = count;
  return std::string(comm.route_name(call.c, blocking));
}

using K = CollectiveKind;
constexpr bool kBlocking = true, kAsync = false;
constexpr std::size_t kSmall = 8;              // 32 B: on the board and packed
constexpr std::size_t kDirect = 16 << 10;      // 64 KiB: Options::direct_blocking_bytes
constexpr std::size_t kLarge = (1 << 20) / 4;  // 1 MiB: Options::ring_threshold_bytes

TEST(RouteChoice, OnOneNodeSmallBlockingCallsTakeTheBoardAndTheRestSharedMemory) {
  MpiCommunicator& comm = world();
  if (!comm.shared_memory()) GTEST_SKIP() << "no shared memory here (1 rank, or ranks on several nodes)";
  EXPECT_EQ(route(comm, K::allreduce, kSmall, kBlocking), "board");
  EXPECT_EQ(route(comm, K::barrier, 0, kBlocking), "board");
  EXPECT_EQ(route(comm, K::broadcast, kSmall, kBlocking), "board");
  EXPECT_EQ(route(comm, K::allreduce, kDirect, kBlocking), "mpi-blocking");  // more than the board holds
  EXPECT_EQ(route(comm, K::gather, kSmall, kBlocking), "mpi-blocking");
  EXPECT_EQ(route(comm, K::allreduce, kSmall, kAsync), "shm");
  EXPECT_EQ(route(comm, K::allreduce, kDirect + 1, kBlocking), "shm");
  EXPECT_EQ(route(comm, K::reduce_scatter, kLarge, kBlocking), "shm");
  EXPECT_EQ(route(comm, K::allgather, kLarge, kAsync), "shm");
  EXPECT_EQ(route(comm, K::scatter, kLarge, kAsync), "mpi");
  EXPECT_EQ(route(comm, K::send, kSmall, kBlocking), "mpi");
}

TEST(RouteChoice, WithoutSharedMemorySmallCallsArePackedAndLargeReductionsTakeTheRing) {
  MpiCommunicator& comm = mpi_world();
  ASSERT_FALSE(comm.shared_memory());
  EXPECT_EQ(route(comm, K::allreduce, kSmall, kBlocking), "packed");
  EXPECT_EQ(route(comm, K::allgather, kSmall, kBlocking), "packed");
  EXPECT_EQ(route(comm, K::reduce, kSmall, kBlocking), "mpi-blocking");  // not packed: see packed_route.hpp
  EXPECT_EQ(route(comm, K::allreduce, kDirect, kBlocking), "mpi-blocking");
  EXPECT_EQ(route(comm, K::allreduce, kSmall, kAsync), "mpi");
  EXPECT_EQ(route(comm, K::allgather, kLarge, kAsync), "mpi");  // MPI's own: nothing to reduce in cache
  const std::string large_reduction = comm.size() > 1 ? "ring" : "mpi";
  EXPECT_EQ(route(comm, K::allreduce, kLarge, kAsync), large_reduction);
  EXPECT_EQ(route(comm, K::allreduce, kLarge, kBlocking), large_reduction);
  EXPECT_EQ(route(comm, K::reduce, kLarge, kAsync), large_reduction);
  EXPECT_EQ(route(comm, K::reduce_scatter, kLarge, kAsync), large_reduction);
  EXPECT_EQ(route(comm, K::allreduce, kLarge - 1, kAsync), "mpi");  // one element under the threshold
}

}  // namespace
}  // namespace troupe::collectives::testing
