// The always-on signature check (Options::check_signatures): the last rank issues a
// different call -- another op, count, dtype or root, or it skipped a call -- on each
// path a collective can take, and every rank must throw CollectiveMismatch naming the
// sequence number and the deviating rank's call. (A blocking call that MPI itself
// leaves hanging is the watchdog's: collectives_watchdog_names_a_mismatch_2ranks.)
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "signature_check.hpp"
#include "test_world.hpp"
#include "troupe/collectives/collective_error.hpp"
#include "troupe/collectives/operation.hpp"
#include "troupe/tensor/half.hpp"

namespace troupe::collectives::testing {
namespace {

struct Path {
  std::string name;
  Options options;
  std::size_t count;  // elements per call on this path
  bool direct;        // a blocking MPI call, which a mismatch of sizes could leave hanging,
  bool packed;        // unless it is packed (packed_route.hpp): then only another root or call
};

std::vector<Path> paths() {
  Options shm = test_options(), engine_shm = test_options(), mpi = test_options(), engine_mpi = test_options(),
          ring = test_options();
  engine_shm.direct_blocking_bytes = 0;
  mpi.shared_memory = engine_mpi.shared_memory = ring.shared_memory = false;
  engine_mpi.direct_blocking_bytes = ring.direct_blocking_bytes = 0;
  ring.ring_threshold_bytes = 0;
  ring.segment_bytes = 64;
  // Across nodes there is no board, and the "board" path is a packed MPI call.
  const bool across_nodes = !world_on_one_node();
  return {{"small call on the board", shm, 8, across_nodes, across_nodes},
          {"direct MPI call, board", shm, 2048, true, false},  // 8 KB: past what the board carries
          {"shared memory, board", engine_shm, 8, false, false},
          {"direct MPI call, all-reduced signature", mpi, 8, true, true},
          {"non-blocking MPI, all-reduced signature", engine_mpi, 8, false, false},
          {"ring, all-reduced signature", ring, 64, false, false}};
}

// Runs `call(comm, deviate)` on a fresh communicator, the last rank deviating, and
// checks that every rank's first call threw CollectiveMismatch naming the deviation.
void expect_mismatch(const Path& path, const std::string& what, const std::function<void(Communicator&, bool)>& call,
                     const std::string& deviant_call) {
  MpiCommunicator comm(MPI_COMM_WORLD, path.options);
  const int last = comm.size() - 1;
  std::string message;
  try {
    call(comm, comm.rank() == last);
  } catch (const CollectiveMismatch& e) {
    message = e.what();
  }
  SCOPED_TRACE(path.name + ", " + what + ", rank " + std::to_string(comm.rank()));
  ASSERT_FALSE(message.empty()) << "no CollectiveMismatch";
  EXPECT_NE(message.find("collective mismatch at sequence #0"), std::string::npos) << message;
  EXPECT_NE(message.find("rank " + std::to_string(last) + ": " + deviant_call), std::string::npos) << message;
  EXPECT_TRUE(comm.failed());
  EXPECT_THROW(comm.barrier(), CommunicatorFailed);
}

class SignatureCheck : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  }
  Path path() const { return paths()[static_cast<std::size_t>(GetParam())]; }
};

TEST_P(SignatureCheck, CatchesAnotherOp) {
  const Path p = path();
  expect_mismatch(
      p, "op",
      [&](Communicator& comm, bool deviate) {
        std::vector<float> data(p.count, 1.0f);
        comm.allreduce(Buffer(data), deviate ? ReduceOp::max : ReduceOp::sum);
      },
      "allreduce #0 (max");
}

TEST_P(SignatureCheck, CatchesAnotherDtypeOfTheSameSize) {
  const Path p = path();
  expect_mismatch(
      p, "dtype",
      [&](Communicator& comm, bool deviate) {
        std::vector<float> f(p.count, 1.0f);
        std::vector<std::int32_t> i(p.count, 1);
        if (deviate)
          comm.allreduce(Buffer(i));
        else
          comm.allreduce(Buffer(f));
      },
      "allreduce #0 (sum, " + std::to_string(p.count) + " x i32");
}

// The rest change sizes or matching, which MPI may answer by waiting for ever inside a
// blocking call: on the engine's paths the check runs beside the call and still ends it,
// and a packed call's messages are received whatever their length (packed_route.cpp).
TEST_P(SignatureCheck, CatchesAnotherCount) {
  const Path p = path();
  if (p.direct && !p.packed)
    GTEST_SKIP() << "a blocking call of another size may hang inside MPI (the watchdog's case)";
  expect_mismatch(
      p, "count",
      [&](Communicator& comm, bool deviate) {
        std::vector<float> data(p.count + (deviate ? 1 : 0), 1.0f);
        comm.allreduce(Buffer(data));
      },
      "allreduce #0 (sum, " + std::to_string(p.count + 1) + " x f32");
}

TEST_P(SignatureCheck, CatchesAnotherRoot) {
  const Path p = path();
  if (p.direct) GTEST_SKIP() << "a blocking call with another root may hang inside MPI (the watchdog's case)";
  expect_mismatch(
      p, "root",
      [&](Communicator& comm, bool deviate) {
        std::vector<float> data(p.count, 1.0f);
        comm.broadcast(Buffer(data), deviate ? 1 : 0);
        // A root on the board returns before comparing (board_route.hpp): rank 0, and a
        // last rank 1 that takes itself for the root, are told at their next call.
        comm.barrier();
      },
      "broadcast #0 (root 1");
}

// The board's small broadcast lets its root return at once; a root whose communicator
// goes before its next call still reports a broadcast its peers did not match.
TEST(DeferredRootCheck, ReportsOnStderrWhenTheCommunicatorGoesFirst) {
  if (world().size() != 2 || !world_on_one_node()) GTEST_SKIP() << "needs two ranks on one node";
  std::string report;
  {
    MpiCommunicator comm(MPI_COMM_WORLD, paths()[0].options);
    std::vector<float> data(4, 1.0f);
    comm.broadcast(Buffer(data), comm.rank());  // each rank takes itself for the root
    ::testing::internal::CaptureStderr();
  }
  report = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(report.find("destroyed before its last broadcast was verified"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 1: broadcast #0 (root 1"), std::string::npos) << report;
}

// A root that keeps broadcasting runs only ShmChannel::kRootRunAhead (8) calls ahead
// of its check: two ranks that each take themselves for the root of a long run of
// broadcasts are both told within it, naming the first call.
TEST(DeferredRootCheck, ARunOfBroadcastsIsCheckedWithinEightCalls) {
  if (world().size() < 2 || !world_on_one_node()) GTEST_SKIP() << "needs two ranks on one node";
  MpiCommunicator comm(MPI_COMM_WORLD, paths()[0].options);
  std::vector<float> data(4, 1.0f);
  int failed_at = -1;
  std::string message;
  for (int i = 0; i < 20 && failed_at < 0; ++i) {
    try {
      comm.broadcast(Buffer(data), comm.rank() == 0 || comm.rank() == 1 ? comm.rank() : 0);
    } catch (const CollectiveMismatch& e) {
      failed_at = i;
      message = e.what();
    }
  }
  if (comm.rank() <= 1) {
    EXPECT_GE(failed_at, 0) << "the mismatched roots were never reported";
    EXPECT_LE(failed_at, 8);
  } else {
    EXPECT_EQ(failed_at, 0) << "a non-root is told in the broadcast itself";
  }
  EXPECT_NE(message.find("broadcast #0"), std::string::npos) << message;
  EXPECT_TRUE(comm.failed());
}

// Many broadcasts from changing roots, past the board's 256 entries: a root that
// returns at once must still not let a peer overwrite an entry it has not compared.
// Runs of 3 calls from one root, then runs of 20 (longer than the root runs ahead).
TEST(DeferredRootCheck, BroadcastsFromChangingRootsKeepTheirData) {
  MpiCommunicator comm(MPI_COMM_WORLD, paths()[0].options);
  std::vector<std::int64_t> data(3);
  for (int i = 0; i < 700; ++i) {
    const int root = (i < 350 ? i / 3 : i / 20) % comm.size();
    std::fill(data.begin(), data.end(), comm.rank() == root ? i : -1);
    comm.broadcast(Buffer(data), root);
    ASSERT_EQ(data[2], i) << "broadcast " << i << " from rank " << root;
  }
  comm.barrier();
  EXPECT_FALSE(comm.failed());
}

TEST_P(SignatureCheck, CatchesASkippedCall) {
  const Path p = path();
  if (p.direct) GTEST_SKIP() << "another collective in a blocking call may hang inside MPI (the watchdog's case)";
  expect_mismatch(
      p, "skipped call",
      [&](Communicator& comm, bool deviate) {
        std::vector<float> data(p.count, 1.0f);
        if (!deviate) comm.allreduce(Buffer(data));  // the last rank skips it
        comm.broadcast(Buffer(data), 0);
      },
      "broadcast #0 (root 0");
}

TEST_P(SignatureCheck, LetsMatchingCallsThrough) {
  const Path p = path();
  MpiCommunicator comm(MPI_COMM_WORLD, p.options);
  std::vector<float> data(p.count, 1.0f);
  for (int i = 0; i < 300; ++i) comm.allreduce(Buffer(data), ReduceOp::max);  // past the board's 256 entries
  comm.broadcast(Buffer(data), comm.size() - 1);
  comm.barrier();
  EXPECT_EQ(data[0], 1.0f);
  EXPECT_FALSE(comm.failed());
}

// Across nodes a small blocking allgather or broadcast carries its signature in its
// own message (packed_route.hpp), as the allreduces above do.
TEST(PackedSignature, AnAllgatherOfAnotherDtypeFailsEveryRank) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  expect_mismatch(
      paths()[3], "allgather dtype",
      [&](Communicator& comm, bool deviate) {
        std::vector<float> f(3, 1.0f), fs(3 * static_cast<std::size_t>(comm.size()));
        std::vector<std::int32_t> i(3, 1), is(fs.size());
        if (deviate)
          comm.allgather(Buffer(i), Buffer(is));
        else
          comm.allgather(Buffer(f), Buffer(fs));
      },
      "allgather #0 (3 x i32");
}

// A small reduce_scatter travels packed too, a record per rank's block.
TEST(PackedSignature, AReduceScatterWithAnotherOpFailsEveryRank) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  expect_mismatch(
      paths()[3], "reduce_scatter op",
      [&](Communicator& comm, bool deviate) {
        std::vector<float> in(3 * static_cast<std::size_t>(comm.size()), 1.0f), out(3);
        comm.reduce_scatter(Buffer(in), Buffer(out), deviate ? ReduceOp::max : ReduceOp::sum);
      },
      "reduce_scatter #0 (max, 3 x f32");
}

// A broadcast's ranks compare the root's signature with their own: the rank that
// differs fails, naming both calls; the others got the root's data as sent.
TEST(PackedSignature, ABroadcastOfAnotherDtypeFailsTheRankThatDiffers) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  MpiCommunicator comm(MPI_COMM_WORLD, paths()[3].options);
  const bool deviate = comm.rank() == comm.size() - 1;
  std::vector<float> f(5, comm.rank() == 0 ? 7.0f : 0.0f);
  std::vector<std::int32_t> i(5, 0);
  if (!deviate) {
    comm.broadcast(Buffer(f), 0);
    EXPECT_EQ(f[4], 7.0f);
    return;
  }
  try {
    comm.broadcast(Buffer(i), 0);
    ADD_FAILURE() << "no CollectiveMismatch";
  } catch (const CollectiveMismatch& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 0: broadcast #0 (root 0, 5 x f32"), std::string::npos) << message;
    EXPECT_NE(message.find(": broadcast #0 (root 0, 5 x i32"), std::string::npos) << message;
  }
  EXPECT_TRUE(comm.failed());
}

TEST(PackedSignature, SmallCallsGiveTheirResults) {
  MpiCommunicator comm(MPI_COMM_WORLD, paths()[3].options);
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<double> sum(6, 1.5), avg(6, static_cast<double>(comm.rank())), mine(2, comm.rank() + 0.5), all(2 * n);
  std::vector<std::uint16_t> half(4, tensor::float_to_bf16_bits(1.0f));
  comm.allreduce(Buffer(sum));
  comm.allreduce(Buffer(avg), ReduceOp::avg);
  comm.allreduce(Buffer(half.data(), half.size(), DType::bf16));
  comm.allgather(Buffer(mine), Buffer(all));
  // Rank q's block for rank r holds 100 q + 10 r + j; the in-place average's blocks, q.
  std::vector<float> blocks(3 * n), block(3);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t j = 0; j < 3; ++j) blocks[3 * r + j] = static_cast<float>(100 * comm.rank() + 10 * r + j);
  comm.reduce_scatter(Buffer(blocks), Buffer(block));
  std::vector<double> ranks(2 * n, static_cast<double>(comm.rank()));
  comm.reduce_scatter(Buffer(ranks), ReduceOp::avg);
  comm.barrier();
  for (std::size_t j = 0; j < 3; ++j)
    EXPECT_EQ(block[j], static_cast<float>(50 * n * (n - 1) + n * (10 * static_cast<std::size_t>(comm.rank()) + j)))
        << j;
  const auto own = 2 * static_cast<std::size_t>(comm.rank());
  EXPECT_EQ(ranks[own + 1], (static_cast<double>(n) - 1) / 2);
  EXPECT_EQ(sum[5], 1.5 * static_cast<double>(n));
  EXPECT_EQ(avg[0], (static_cast<double>(n) - 1) / 2);
  EXPECT_EQ(tensor::bf16_bits_to_float(half[3]), static_cast<float>(n));
  for (std::size_t r = 0; r < n; ++r) EXPECT_EQ(all[2 * r + 1], static_cast<double>(r) + 0.5) << r;
  EXPECT_FALSE(comm.failed());
}

// The check as the NCCL backend wraps its calls (NcclCommunicator::signed_operation),
// on CPU, where a test can make the ranks disagree: two ranks cannot share one GPU,
// and this machine has none. `DeviceCall` stands for the call's queued kernels: it
// finishes only when told to -- or never, as mismatched NCCL kernels spin -- and once
// aborted it fails, as NCCL's calls do after ncclCommAbort.
class DeviceCall final : public Operation {
 public:
  explicit DeviceCall(Collective c) : Operation(std::move(c)) {}
  void start() override { started = true; }
  bool progress() override {
    if (aborted) throw CommunicatorFailed("the device call was aborted");
    return finished;
  }
  bool queue_device_wait() override {
    ++device_waits;
    return true;
  }
  bool started = false, finished = false, aborted = false;
  int device_waits = 0;
};

struct CheckedDeviceCall {
  CheckedDeviceCall(MPI_Comm comm, int rank, int size, Collective c)
      : call(std::make_shared<DeviceCall>(c)),
        checked(
            detail::with_signature_check(call, nullptr, comm, rank, size, std::chrono::seconds(30), nullptr, [this] {
              ++aborts;
              call->aborted = true;
            })) {
    checked->start();
  }
  // Polls the checked call until it completes (true), fails (its error rethrown) or 20 s pass (false).
  bool poll() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline)
      if (checked->progress()) return true;
    return false;
  }
  std::shared_ptr<DeviceCall> call;
  std::shared_ptr<Operation> checked;
  int aborts = 0;
};

Collective device_allreduce(std::size_t count, ReduceOp op) {
  Collective c;
  c.kind = CollectiveKind::allreduce;
  c.count = count;
  c.op = op;
  return c;
}

class DeviceCallCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  void TearDown() override { MPI_Comm_free(&comm_); }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

// Kernels that never return must not hide a mismatch: every rank throws it, naming the
// deviating rank's call, and aborts its device call exactly once.
TEST_F(DeviceCallCheck, AMismatchAbortsCallsThatWouldNeverFinish) {
  if (size_ < 2) GTEST_SKIP() << "needs two ranks to disagree";
  const bool deviate = rank_ == size_ - 1;
  CheckedDeviceCall c(comm_, rank_, size_, device_allreduce(deviate ? 999 : 1000, ReduceOp::sum));
  EXPECT_TRUE(c.call->started) << "the device call is queued at once, beside the exchange";
  std::string message;
  try {
    c.poll();
  } catch (const CollectiveMismatch& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "no CollectiveMismatch on rank " << rank_;
  EXPECT_NE(message.find("rank " + std::to_string(size_ - 1) + ": allreduce #0 (sum, 999 x f32"), std::string::npos)
      << message;
  EXPECT_EQ(c.aborts, 1);
  EXPECT_TRUE(c.call->aborted);
}

// Calls that agree complete when their device part does, and never abort; a device
// wait goes to the device call and returns at once.
TEST_F(DeviceCallCheck, MatchingCallsCompleteWithTheirDevicePart) {
  for (std::uint64_t seq = 0; seq < 3; ++seq) {
    Collective same = device_allreduce(1000, ReduceOp::max);
    same.sequence = seq;
    CheckedDeviceCall c(comm_, rank_, size_, same);
    EXPECT_TRUE(c.checked->queue_device_wait());
    EXPECT_EQ(c.call->device_waits, 1);
    EXPECT_FALSE(c.checked->progress()) << "done before its device part";
    c.call->finished = true;
    EXPECT_TRUE(c.poll());
    EXPECT_EQ(c.aborts, 0);
  }
}

std::string path_name(const ::testing::TestParamInfo<int>& info) {
  static const char* const names[] = {"OnTheBoard",       "DirectBoard",    "SharedMemory",
                                      "DirectAllreduced", "NonBlockingMpi", "Ring"};
  return names[info.param];
}

INSTANTIATE_TEST_SUITE_P(Paths, SignatureCheck, ::testing::Range(0, 6), path_name);

}  // namespace
}  // namespace troupe::collectives::testing
