// Small blocking calls on one node, carried whole by the signature board
// (collectives/src/board_route.hpp): the same bits as the shared-memory rounds that
// async calls take, on every rank; entries reused far past the board's size; a rank
// that never comes named in a TimeoutError instead of a hang.
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_world.hpp"
#include "troupe/collectives/collective_error.hpp"
#include "troupe/error.hpp"

namespace troupe::collectives::testing {
namespace {

bool on_one_node_with_shm(Communicator& comm) { return comm.size() > 1 && world_on_one_node(); }

// Values with fractions, so that the order of the combines shows in the low bits.
Data noisy(DType dtype, std::size_t count, int rank, unsigned salt) {
  Data d(dtype, count);
  std::mt19937 gen(1000u * salt + static_cast<unsigned>(rank));
  std::uniform_real_distribution<double> dist(-3.0, 3.0);
  for (std::size_t i = 0; i < count; ++i) d.set(i, dtype == DType::i64 ? std::floor(dist(gen) * 100) : dist(gen));
  return d;
}

bool same_bytes(const Data& a, const Data& b) {
  return a.count == b.count &&
         std::memcmp(a.bytes.data(), b.bytes.data(), a.count * tensor::element_size(a.dtype)) == 0;
}

// Rank 0's bytes of `d`, for every rank to compare with its own.
Data rank0s(Data d) {
  world().broadcast(d.buffer(), 0);
  return d;
}

TEST(BoardCall, GivesTheBitsOfTheSharedMemoryRoundsOnEveryRank) {
  Communicator& comm = world();
  if (!on_one_node_with_shm(comm)) GTEST_SKIP() << "needs two or more ranks on one node";
  const int n = comm.size(), rank = comm.rank();
  unsigned salt = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64}) {
    // 1024 f32 fill the board's 4 KB exactly; the others stay below it.
    for (std::size_t count : {std::size_t{1}, std::size_t{7}, 4096 / tensor::element_size(dtype) / 4}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        if (op == ReduceOp::avg && dtype == DType::i64) continue;
        SCOPED_TRACE(::testing::Message() << dtype << " x " << count << " " << op);
        const Data input = noisy(dtype, count, rank, ++salt);
        Data on_board = input, in_rounds = input;
        comm.allreduce(on_board.buffer(), op);                // blocking and small: the board
        comm.allreduce_async(in_rounds.buffer(), op).wait();  // async: the shared-memory rounds
        EXPECT_TRUE(same_bytes(on_board, in_rounds));
        EXPECT_TRUE(same_bytes(on_board, rank0s(on_board)));

        Data scattered(dtype, count), scattered_async(dtype, count), whole = noisy(dtype, count * n, rank, ++salt);
        comm.reduce_scatter(whole.buffer(), scattered.buffer(), op);
        comm.reduce_scatter_async(whole.buffer(), scattered_async.buffer(), op).wait();
        EXPECT_TRUE(same_bytes(scattered, scattered_async));

        Data reduced_at_root = input;
        comm.reduce(reduced_at_root.buffer(), n - 1, op);
        if (rank == n - 1) {
          EXPECT_TRUE(same_bytes(reduced_at_root, on_board));
        }
      }
      Data gathered(dtype, count * n), bcast = noisy(dtype, count, rank, ++salt), mine = noisy(dtype, count, rank, 7);
      comm.allgather(mine.buffer(), gathered.buffer());
      for (int q = 0; q < n; ++q) {
        const Data theirs = noisy(dtype, count, q, 7);
        EXPECT_EQ(std::memcmp(gathered.bytes.data() + q * count * tensor::element_size(dtype), theirs.bytes.data(),
                              count * tensor::element_size(dtype)),
                  0)
            << "block " << q;
      }
      comm.broadcast(bcast.buffer(), n - 1);
      EXPECT_TRUE(same_bytes(bcast, noisy(dtype, count, n - 1, salt)));
    }
  }
}

TEST(BoardCall, InPlaceFormsReadTheirOwnDataBackFromTheBoard) {
  Communicator& comm = world();
  if (!on_one_node_with_shm(comm)) GTEST_SKIP() << "needs two or more ranks on one node";
  const int n = comm.size(), rank = comm.rank();
  const std::size_t block = 5;
  Data all(DType::f32, block * n);
  for (std::size_t i = 0; i < block; ++i) all.set(rank * block + i, rank * 10.0 + static_cast<double>(i));
  comm.allgather(all.buffer());
  EXPECT_EQ(
      compare(all, [&](std::size_t i) { return static_cast<double>(i / block) * 10 + static_cast<double>(i % block); }),
      "");
  Data sums(DType::f32, block * n);
  for (std::size_t i = 0; i < sums.count; ++i) sums.set(i, static_cast<double>(i));
  comm.reduce_scatter(sums.buffer());
  Data mine(DType::f32, block);
  std::memcpy(mine.bytes.data(), sums.bytes.data() + rank * block * sizeof(float), block * sizeof(float));
  EXPECT_EQ(
      compare(mine, [&](std::size_t i) { return static_cast<double>(n) * static_cast<double>(rank * block + i); }), "");
}

TEST(BoardCall, ReusesItsEntriesFarPastTheBoardsSize) {
  Communicator& comm = world();
  const int n = comm.size(), rank = comm.rank();
  // 600 calls, twice round the board's 256 entries and more, of every kind it carries.
  for (int call = 0; call < 600; ++call) {
    std::vector<double> value(3, rank + call), gathered(3 * static_cast<std::size_t>(n));
    switch (call % 4) {
      case 0:
        comm.allreduce(Buffer(value));
        ASSERT_EQ(value[2], static_cast<double>(n) * call + n * (n - 1) / 2.0) << "call " << call;
        break;
      case 1:
        comm.broadcast(Buffer(value), call % n);
        ASSERT_EQ(value[0], static_cast<double>(call % n + call)) << "call " << call;
        break;
      case 2:
        comm.allgather(Buffer(value), Buffer(gathered));
        ASSERT_EQ(gathered[3 * static_cast<std::size_t>(n - 1)], static_cast<double>(n - 1 + call)) << "call " << call;
        break;
      default: comm.barrier();
    }
  }
  EXPECT_FALSE(comm.failed());
}

TEST(BoardCall, ARankThatNeverComesIsNamedInATimeoutError) {
  if (!on_one_node_with_shm(world())) GTEST_SKIP() << "needs two or more ranks on one node";
  Options options = test_options();
  options.timeout = std::chrono::milliseconds(1500);  // #0 must pass on a loaded machine
  MpiCommunicator comm(MPI_COMM_WORLD, options);
  const int late = comm.size() - 1;
  float value = 1.0f;
  comm.allreduce(Buffer(&value, 1));  // #0: everyone
  if (comm.rank() != late) {
    std::string message;
    try {
      comm.allreduce(Buffer(&value, 1));  // #1: the last rank never issues it
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("allreduce #1"), std::string::npos) << message;
    EXPECT_NE(message.find("rank " + std::to_string(late) + " did not issue this call within 1500 ms"),
              std::string::npos)
        << message;
    EXPECT_TRUE(comm.failed());
  }
  world().barrier();
}

}  // namespace
}  // namespace troupe::collectives::testing
