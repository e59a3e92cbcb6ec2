// allreduce: every reduction x dtype x in-place/out-of-place x size, against a
// reference every rank computes from every rank's inputs: with the default options
// (shared memory where the ranks share a node), over MPI alone (MPI_Iallreduce below
// 1 MB, the ring above), with the ring forced at every size and tiny segments, and
// through shared memory with tiny slots, so that small buffers take the multi-segment
// and multi-round paths.
#include <memory>
#include <string>
#include <tuple>

#include "test_world.hpp"
#include "troupe/collectives/collective_error.hpp"

namespace troupe::collectives::testing {
namespace {

using Param = std::tuple<ReduceOp, DType, bool>;

std::string name_of(const ::testing::TestParamInfo<Param>& info) {
  const auto [op, dtype, in_place] = info.param;
  return std::string(reduce_op_name(op)) + "_" + dtype_label(dtype) + (in_place ? "_in_place" : "_out_of_place");
}

void check_allreduce(Communicator& comm, ReduceOp op, DType dtype, bool in_place, std::size_t n) {
  const Pattern pattern = pattern_for(op);
  Data input = input_of(pattern, dtype, comm.rank(), n);
  Data output(dtype, n);
  if (in_place) {
    comm.allreduce(input.buffer(), op);
  } else {
    comm.allreduce(input.buffer(), output.buffer(), op);
  }
  const Data& got = in_place ? input : output;
  EXPECT_EQ(compare(
                got, [&](std::size_t i) { return reduced(op, pattern, dtype, comm.size(), i); }, tolerance(op, dtype)),
            "")
      << "size " << n << " on rank " << comm.rank();
  if (!in_place) {
    // Out of place leaves the input alone.
    EXPECT_EQ(compare(input, [&](std::size_t i) { return value(pattern, dtype, comm.rank(), i); }), "");
  }
}

class AllreduceOnEveryRank : public ::testing::TestWithParam<Param> {};

TEST_P(AllreduceOnEveryRank, MatchesTheReferenceAtEverySize) {
  const auto [op, dtype, in_place] = GetParam();
  if (!reduce_op_supports(op, dtype)) GTEST_SKIP() << op << " is rejected on " << dtype;
  for (std::size_t n : kSizes) check_allreduce(world(), op, dtype, in_place, n);
  for (std::size_t n : kSizes) check_allreduce(mpi_world(), op, dtype, in_place, n);
}

TEST_P(AllreduceOnEveryRank, MatchesTheReferenceThroughSharedMemoryWithTinySlots) {
  const auto [op, dtype, in_place] = GetParam();
  if (!reduce_op_supports(op, dtype)) GTEST_SKIP() << op << " is rejected on " << dtype;
  for (std::size_t n : kSmallSizes) check_allreduce(tiny_slot_world(), op, dtype, in_place, n);
}

TEST_P(AllreduceOnEveryRank, MatchesTheReferenceThroughTheRingWithTinySegments) {
  const auto [op, dtype, in_place] = GetParam();
  if (!reduce_op_supports(op, dtype)) GTEST_SKIP() << op << " is rejected on " << dtype;
  static std::unique_ptr<MpiCommunicator> ring = [] {
    Options options = test_options();
    options.shared_memory = false;
    options.ring_threshold_bytes = 0;
    options.segment_bytes = 24;  // a few elements per message
    options.ring_window = 2;
    return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, options);
  }();
  for (std::size_t n : kSmallSizes) check_allreduce(*ring, op, dtype, in_place, n);
  if (op == ReduceOp::sum && (dtype == DType::f32 || dtype == DType::bf16)) {
    check_allreduce(*ring, op, dtype, in_place, kSizes.back());
  }
  // The last test using it frees it, while MPI is still initialised.
  if (op == ReduceOp::prod && dtype == DType::u8 && in_place) ring.reset();
}

INSTANTIATE_TEST_SUITE_P(AllOpsAndDTypes, AllreduceOnEveryRank,
                         ::testing::Combine(::testing::Values(ReduceOp::sum, ReduceOp::avg, ReduceOp::max,
                                                              ReduceOp::min, ReduceOp::prod),
                                            ::testing::ValuesIn(tensor::kAllDTypes), ::testing::Bool()),
                         name_of);

TEST(Allreduce, OfBf16SumsRoundOncePerRingHopAndAgreeBitwiseOnEveryRank) {
  // 1 + k * 2^-8 is not representable in bf16 (8 bits of mantissa): every hop rounds.
  Communicator& comm = world();
  const std::size_t n = 4099;
  Data data(DType::bf16, n);
  for (std::size_t i = 0; i < n; ++i) data.set(i, 1.0 + static_cast<double>((i + comm.rank()) % 5) / 256.0);
  comm.allreduce(data.buffer());
  // Within one rounding per hop of the exact sum ...
  for (std::size_t i = 0; i < n; i += 97) {
    double exact = 0;
    for (int r = 0; r < comm.size(); ++r) {
      exact += static_cast<float>(tensor::BFloat16(static_cast<float>(1.0 + static_cast<double>((i + r) % 5) / 256.0)));
    }
    EXPECT_NEAR(data.get(i), exact, comm.size() * exact / 256.0) << "element " << i;
  }
  // ... and the same bits everywhere: rank 0's result, broadcast, equals ours.
  Data theirs = data;
  comm.broadcast(theirs.buffer(), 0);
  EXPECT_EQ(theirs.bytes, data.bytes);
}

// Through shared memory a reduce is an allreduce that only the root copies out: its
// bf16 sum has the allreduce's bits (what lets ZeRO-2 reduce each bucket to its owner
// and still match DDP bit for bit).
TEST(Allreduce, AReduceThroughSharedMemoryHasTheAllreducesBits) {
  MpiCommunicator& comm = world();
  if (!comm.shared_memory()) GTEST_SKIP() << "no shared memory between these ranks";
  const std::size_t n = (std::size_t{1} << 18) + 5;  // several rounds of a slot
  Data reduced(DType::bf16, n);
  for (std::size_t i = 0; i < n; ++i) reduced.set(i, 1.0 + static_cast<double>((i * 7 + comm.rank()) % 11) / 256.0);
  Data all = reduced;
  comm.allreduce(all.buffer(), ReduceOp::avg);
  for (int root = 0; root < comm.size(); ++root) {
    Data mine = reduced;
    comm.reduce(mine.buffer(), root, ReduceOp::avg);
    if (comm.rank() == root) {
      EXPECT_EQ(mine.bytes, all.bytes) << "root " << root;
    }
  }
}

// Off one node a large reduce runs the allreduce's ring: the root gets the allreduce's
// bits, and every other rank's buffer, in place or not, is left as it was.
TEST(Allreduce, AReduceThroughTheRingHasTheAllreducesBitsAndLeavesTheOtherRanksAlone) {
  MpiCommunicator& comm = mpi_world();
  const std::size_t n = (std::size_t{1} << 18) + 5;  // 1 MiB + 20 B: over the ring's threshold
  Data input(DType::f32, n);
  for (std::size_t i = 0; i < n; ++i) input.set(i, 1.0 + static_cast<double>((i * 7 + comm.rank()) % 11) / 3.0);
  Data all = input;
  comm.allreduce(all.buffer(), ReduceOp::avg);
  for (int root = 0; root < comm.size(); ++root) {
    Data in_place = input, kept = input, out(DType::f32, n);
    comm.reduce(in_place.buffer(), root, ReduceOp::avg);
    comm.reduce(kept.buffer(), out.buffer(), root, ReduceOp::avg);
    EXPECT_EQ(kept.bytes, input.bytes) << "root " << root;
    if (comm.rank() == root) {
      EXPECT_EQ(in_place.bytes, all.bytes) << "root " << root;
      EXPECT_EQ(out.bytes, all.bytes) << "root " << root;
    } else {
      EXPECT_EQ(in_place.bytes, input.bytes) << "root " << root;
    }
  }
}

TEST(Allreduce, OnAvgOfIntegersIsRejectedBeforeAnythingIsSent) {
  Data data(DType::i32, 4);
  const auto before = world().next_sequence();
  EXPECT_THROW(world().allreduce(data.buffer(), ReduceOp::avg), InvalidArgument);
  EXPECT_EQ(world().next_sequence(), before);
}

}  // namespace
}  // namespace troupe::collectives::testing
