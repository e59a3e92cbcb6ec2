// broadcast, reduce, allgather, reduce_scatter, gather, scatter, barrier and send/recv:
// every dtype x in-place/out-of-place x size (and every reduction where there is one),
// against a reference every rank computes.
#include <cstring>
#include <string>
#include <tuple>

#include "test_world.hpp"

namespace troupe::collectives::testing {
namespace {

// Which communicator: the default (shared memory where the ranks share a node), MPI
// alone, shared memory in rounds of a few elements, or MPI with the ring forced in
// segments of a few elements (those two at small sizes only).
enum class Transport { shm, mpi, tiny_slots, ring };
using CollectiveParam = std::tuple<DType, bool, Transport>;

std::string collective_name(const ::testing::TestParamInfo<CollectiveParam>& info) {
  const auto [dtype, in_place, transport] = info.param;
  const char* suffix = transport == Transport::shm          ? ""
                       : transport == Transport::mpi        ? "_mpi"
                       : transport == Transport::tiny_slots ? "_tiny_slots"
                                                            : "_ring";
  return dtype_label(dtype) + (in_place ? "_in_place" : "_out_of_place") + suffix;
}

Communicator& communicator_for(Transport transport) {
  switch (transport) {
    case Transport::mpi: return mpi_world();
    case Transport::tiny_slots: return tiny_slot_world();
    case Transport::ring: return ring_world();
    default: return world();
  }
}

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod};

class CollectivesOnEveryRank : public ::testing::TestWithParam<CollectiveParam> {
 protected:
  DType dtype = std::get<0>(GetParam());
  bool in_place = std::get<1>(GetParam());
  Transport transport = std::get<2>(GetParam());
  Communicator& comm = communicator_for(transport);
  int rank = comm.rank();
  int size = comm.size();
  std::size_t n_ranks = static_cast<std::size_t>(comm.size());
  // Tiny slots and segments take a round per few elements: the large size would only be slow.
  const std::vector<std::size_t>& sizes =
      transport == Transport::tiny_slots || transport == Transport::ring ? kSmallSizes : kSizes;
};

TEST_P(CollectivesOnEveryRank, BroadcastCopiesEachRootsBufferEverywhere) {
  for (std::size_t n : sizes) {
    for (int root = 0; root < size; ++root) {
      Data input = input_of(Pattern::mixed, dtype, rank, n);
      Data output(dtype, n);
      if (in_place) {
        comm.broadcast(input.buffer(), root);
      } else {
        comm.broadcast(input.buffer(), output.buffer(), root);
      }
      EXPECT_EQ(
          compare(in_place ? input : output, [&](std::size_t i) { return value(Pattern::mixed, dtype, root, i); }), "")
          << "size " << n << " root " << root;
      if (n > 1024) break;  // one root is enough at the large size
    }
  }
}

TEST_P(CollectivesOnEveryRank, ReduceLeavesEveryReductionOnTheRoot) {
  for (ReduceOp op : kOps) {
    if (!reduce_op_supports(op, dtype)) continue;
    const Pattern pattern = pattern_for(op);
    for (std::size_t n : sizes) {
      const int root = static_cast<int>(n % n_ranks);
      Data input = input_of(pattern, dtype, rank, n);
      Data output(dtype, n);
      if (in_place) {
        comm.reduce(input.buffer(), root, op);
      } else {
        comm.reduce(input.buffer(), output.buffer(), root, op);
      }
      if (rank == root) {
        EXPECT_EQ(compare(
                      in_place ? input : output, [&](std::size_t i) { return reduced(op, pattern, dtype, size, i); },
                      tolerance(op, dtype)),
                  "")
            << op << " size " << n;
      }
    }
  }
}

TEST_P(CollectivesOnEveryRank, AllgatherPutsRankIsInputAtBlockI) {
  for (std::size_t n : sizes) {
    Data output(dtype, n * n_ranks);
    if (in_place) {
      Data mine = input_of(Pattern::mixed, dtype, rank, n);
      if (n)
        std::memcpy(output.bytes.data() + rank * mine.count * tensor::element_size(dtype), mine.bytes.data(),
                    n * tensor::element_size(dtype));
      comm.allgather(output.buffer());
    } else {
      Data input = input_of(Pattern::mixed, dtype, rank, n);
      comm.allgather(input.buffer(), output.buffer());
    }
    EXPECT_EQ(
        compare(output, [&](std::size_t i) { return value(Pattern::mixed, dtype, static_cast<int>(i / n), i % n); }),
        "")
        << "size " << n;
  }
}

TEST_P(CollectivesOnEveryRank, AllgatherIntoOneBufferPerRankFillsEach) {
  if (in_place) GTEST_SKIP() << "the list form has no in-place variant";
  for (std::size_t n : kSmallSizes) {
    Data input = input_of(Pattern::mixed, dtype, rank, n);
    std::vector<Data> outputs(n_ranks, Data(dtype, n));
    std::vector<Buffer> views;
    for (auto& o : outputs) views.push_back(o.buffer());
    comm.allgather(input.buffer(), std::span<const Buffer>(views));
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(compare(outputs[r], [&](std::size_t i) { return value(Pattern::mixed, dtype, r, i); }), "")
          << "size " << n << " block " << r;
    }
  }
}

TEST_P(CollectivesOnEveryRank, ReduceScatterLeavesBlockIReducedOnRankI) {
  for (ReduceOp op : kOps) {
    if (!reduce_op_supports(op, dtype)) continue;
    const Pattern pattern = pattern_for(op);
    for (std::size_t n : sizes) {
      if (n > 1024 && op != ReduceOp::sum) continue;  // the large size once per dtype
      Data input = input_of(pattern, dtype, rank, n * n_ranks);
      Data output(dtype, n);
      const std::size_t first = static_cast<std::size_t>(rank) * n;
      if (in_place) {
        comm.reduce_scatter(input.buffer(), op);
        Data mine(dtype, n);
        if (n)
          std::memcpy(mine.bytes.data(), input.bytes.data() + first * tensor::element_size(dtype),
                      n * tensor::element_size(dtype));
        output = mine;
      } else {
        comm.reduce_scatter(input.buffer(), output.buffer(), op);
      }
      EXPECT_EQ(compare(
                    output, [&](std::size_t i) { return reduced(op, pattern, dtype, size, first + i); },
                    tolerance(op, dtype)),
                "")
          << op << " size " << n;
    }
  }
}

TEST_P(CollectivesOnEveryRank, GatherCollectsEveryInputOnTheRoot) {
  for (std::size_t n : sizes) {
    const int root = static_cast<int>((n + 1) % n_ranks);
    Data output(dtype, rank == root ? n * n_ranks : 0);
    Data input = input_of(Pattern::mixed, dtype, rank, n);
    if (in_place && rank == root) {
      if (n)
        std::memcpy(output.bytes.data() + rank * n * tensor::element_size(dtype), input.bytes.data(),
                    n * tensor::element_size(dtype));
      Buffer whole = output.buffer();
      comm.gather(whole.slice(rank * n, n), whole, root);
    } else {
      comm.gather(input.buffer(), output.buffer(), root);
    }
    if (rank == root) {
      EXPECT_EQ(
          compare(output, [&](std::size_t i) { return value(Pattern::mixed, dtype, static_cast<int>(i / n), i % n); }),
          "")
          << "size " << n;
    }
  }
}

TEST_P(CollectivesOnEveryRank, ScatterSendsBlockIOfTheRootToRankI) {
  for (std::size_t n : sizes) {
    const int root = static_cast<int>((n + 2) % n_ranks);
    // The root's input: block i holds rank i's pattern.
    Data input(dtype, rank == root ? n * n_ranks : 0);
    for (std::size_t i = 0; i < input.count; ++i)
      input.set(i, value(Pattern::mixed, dtype, static_cast<int>(i / n), i % n));
    Data output(dtype, n);
    if (in_place && rank == root) {
      Buffer whole = input.buffer();
      comm.scatter(whole, whole.slice(rank * n, n), root);
      if (n)
        std::memcpy(output.bytes.data(), input.bytes.data() + rank * n * tensor::element_size(dtype),
                    n * tensor::element_size(dtype));
    } else {
      comm.scatter(input.buffer(), output.buffer(), root);
    }
    EXPECT_EQ(compare(output, [&](std::size_t i) { return value(Pattern::mixed, dtype, rank, i); }), "")
        << "size " << n;
  }
}

TEST_P(CollectivesOnEveryRank, SendAndRecvPassABufferAroundTheRing) {
  if (in_place) GTEST_SKIP() << "point to point has no in-place form";
  for (std::size_t n : sizes) {
    Data mine = input_of(Pattern::mixed, dtype, rank, n);
    Data theirs(dtype, n);
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    if (size == 1) break;
    Work received = comm.recv_async(theirs.buffer(), left, 5);
    comm.send(mine.buffer(), right, 5);
    received.wait();
    EXPECT_EQ(compare(theirs, [&](std::size_t i) { return value(Pattern::mixed, dtype, left, i); }), "")
        << "size " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CollectivesOnEveryRank,
                         ::testing::Combine(::testing::ValuesIn(tensor::kAllDTypes), ::testing::Bool(),
                                            ::testing::Values(Transport::shm, Transport::mpi, Transport::tiny_slots,
                                                              Transport::ring)),
                         collective_name);

TEST(Barrier, ReturnsOnEveryRankAndNumbersTheCall) {
  const auto before = world().next_sequence();
  world().barrier();
  EXPECT_EQ(world().next_sequence(), before + 1);
}

}  // namespace
}  // namespace troupe::collectives::testing

namespace troupe::collectives::testing {
namespace {

// Each rank's part is under Options::direct_blocking_bytes and the root's whole buffer
// above it: the route must be chosen from what every rank knows (the per-rank count),
// or the root posts MPI_Igather against its peers' MPI_Gather and all of them hang.
TEST(RouteAgreement, GatherAndScatterNearTheDirectLimitTakeOneRouteOnEveryRank) {
  Communicator& comm = world();
  const int size = comm.size(), rank = comm.rank();
  const std::size_t count = comm.options().direct_blocking_bytes * 3 / 4 / sizeof(float);
  for (int root = 0; root < size; ++root) {
    std::vector<float> mine(count, static_cast<float>(rank + 1));
    std::vector<float> all(rank == root ? count * static_cast<std::size_t>(size) : 0);
    comm.gather(Buffer(mine), Buffer(all), root);
    for (std::size_t i = 0; i < all.size(); i += count) ASSERT_EQ(all[i], static_cast<float>(i / count + 1));
    std::vector<float> part(count);
    comm.scatter(Buffer(all), Buffer(part), root);
    ASSERT_EQ(part.front(), static_cast<float>(rank + 1));
    ASSERT_EQ(part.back(), static_cast<float>(rank + 1));
  }
}

}  // namespace
}  // namespace troupe::collectives::testing
