#include "troupe/collectives/nccl_communicator.hpp"

#include <mpi.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "engine.hpp"
#include "nccl_library.hpp"
#include "reissue.hpp"
#include "signature_check.hpp"
#include "troupe/collectives/collective_error.hpp"
#include "troupe/collectives/operation.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::collectives {

namespace {

// Loaded by the constructor (or available()) before anything else here runs.
const detail::NcclLibrary& api() { return detail::nccl_library("the NCCL backend"); }

void check_cuda(cudaError_t status, const char* what, const std::string& context) {
  if (status != cudaSuccess)
    TROUPE_THROW(NcclError, context, ": ", what, " failed: ", api().cudaGetErrorString(status));
}
void check_nccl(ncclResult_t status, const char* what, const std::string& context) {
  if (status != ncclSuccess && status != ncclInProgress) {
    TROUPE_THROW(NcclError, context, ": ", what, " failed: ", api().ncclGetErrorString(status));
  }
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

// This process's rank among its host's ranks.
int local_rank(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  TROUPE_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  return rank;
}

// NCCL refuses two ranks of one communicator on a device ("invalid usage"); this says
// which ranks first, on every rank alike. Collective over `bootstrap` (its allgather is
// bounded by the timeout, as the id's broadcast is).
void check_one_rank_a_device(MpiCommunicator& bootstrap, int device, int devices, const std::string& context) {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(std::hash<std::string>{}(name)), device};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(bootstrap.size()));
  bootstrap.allgather(Buffer(mine), Buffer(all));
  for (std::size_t a = 0; a < all.size(); a += 2)
    for (std::size_t b = a + 2; b < all.size(); b += 2)
      TROUPE_CHECK(all[a] != all[b] || all[a + 1] != all[b + 1], context, ": ranks ", a / 2, " and ", b / 2,
                   " share CUDA device ", all[a + 1], " (their host shows ", devices,
                   "), and NCCL needs a device per rank; run at most one rank per device, or send the ",
                   "collectives over MPI through host copies (StagedCommunicator; --backend mpi)");
}

// Errors come back as codes, for TROUPE_MPI_CHECK to throw with context.
MPI_Comm returning_errors(MPI_Comm comm) {
  if (comm != MPI_COMM_NULL) TROUPE_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return comm;
}

}  // namespace

namespace detail {

struct NcclState {
  ncclComm_t comm = nullptr;  // null once aborted
  cudaStream_t stream = nullptr;
  int device = 0;
  int rank = 0;

  // Stops this communicator's kernels, hung or not. Operations in flight then fail
  // (their state outlives the communicator when the engine keeps them after a failure,
  // so this cannot wait for the destructor).
  void abort_communicator() noexcept {
    if (!comm) return;
    api().cudaSetDevice(device);
    api().ncclCommAbort(comm);
    comm = nullptr;
  }
  ~NcclState() {
    api().cudaSetDevice(device);
    if (comm) api().ncclCommDestroy(comm);
    if (stream) api().cudaStreamDestroy(stream);
  }
};

void check_not_aborted(const NcclState& s, const std::string& what) {
  if (!s.comm) {
    TROUPE_THROW(NcclError, what, ": the NCCL communicator on rank ", s.rank, " was aborted after an earlier error");
  }
}

// One collective queued on the communicator's stream; done when its event fires.
class NcclOperation : public Operation {
 public:
  NcclOperation(Collective c, std::shared_ptr<NcclState> state, int size)
      : Operation(std::move(c)), state_(std::move(state)), size_(size) {}
  ~NcclOperation() override {
    if (inputs_ready_) api().cudaEventDestroy(inputs_ready_);
    if (finished_) api().cudaEventDestroy(finished_);
  }

  void start() override {
    const Collective& c = collective();
    const std::string what = c.describe();
    NcclState& s = *state_;
    check_not_aborted(s, what);
    check_cuda(api().cudaSetDevice(s.device), "cudaSetDevice", what);
    check_cuda(api().cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming), "cudaEventCreate", what);
    check_cuda(api().cudaEventCreateWithFlags(&finished_, cudaEventDisableTiming), "cudaEventCreate", what);
    // Inputs are written by kernels on the legacy default stream: wait for them.
    check_cuda(api().cudaEventRecord(inputs_ready_, cudaStreamLegacy), "cudaEventRecord", what);
    check_cuda(api().cudaStreamWaitEvent(s.stream, inputs_ready_, 0), "cudaStreamWaitEvent", what);
    enqueue(c, what);
    check_cuda(api().cudaEventRecord(finished_, s.stream), "cudaEventRecord", what);
  }

  bool queue_device_wait() override {
    const std::string what = collective().describe();
    check_cuda(api().cudaSetDevice(state_->device), "cudaSetDevice", what);
    check_cuda(api().cudaStreamWaitEvent(cudaStreamLegacy, finished_, 0), "cudaStreamWaitEvent", what);
    return true;
  }

  bool progress() override {
    const std::string_view name = collective_name(collective().kind);
    check_not_aborted(*state_, collective().describe());
    ncclResult_t async = ncclSuccess;
    api().ncclCommGetAsyncError(state_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      TROUPE_THROW(NcclError, collective().describe(), ": NCCL reported an error on rank ", state_->rank, ": ",
                   api().ncclGetErrorString(async));
    }
    const cudaError_t status = api().cudaEventQuery(finished_);
    if (status == cudaErrorNotReady) return false;
    check_cuda(status, "the collective's kernel", std::string(name));
    return true;
  }

 private:
  void enqueue(const Collective& c, const std::string& what) {
    using K = CollectiveKind;
    NcclState& s = *state_;
    const ncclDataType_t type = nccl_type(c.dtype);
    const std::size_t n = c.count;
    const std::size_t block = n * tensor::element_size(c.dtype);
    void* in = c.input.data;
    void* out = c.output.data;
    switch (c.kind) {
      case K::allreduce:
        return check_nccl(api().ncclAllReduce(in, out, n, type, nccl_op(c.op), s.comm, s.stream), "ncclAllReduce",
                          what);
      case K::broadcast:
        return check_nccl(api().ncclBroadcast(s.rank == c.root ? in : out, out, n, type, c.root, s.comm, s.stream),
                          "ncclBroadcast", what);
      case K::reduce:
        return check_nccl(
            api().ncclReduce(in, s.rank == c.root ? out : in, n, type, nccl_op(c.op), c.root, s.comm, s.stream),
            "ncclReduce", what);
      case K::allgather:
        return check_nccl(api().ncclAllGather(c.in_place ? static_cast<std::byte*>(out) + s.rank * block : in, out, n,
                                              type, s.comm, s.stream),
                          "ncclAllGather", what);
      case K::reduce_scatter:
        return check_nccl(api().ncclReduceScatter(in, out, n, type, nccl_op(c.op), s.comm, s.stream),
                          "ncclReduceScatter", what);
      case K::gather:
      case K::scatter: {
        // Point to point in one group: the root sends (scatter) or receives (gather)
        // one block per rank, its own block included.
        const bool gather = c.kind == K::gather;
        check_nccl(api().ncclGroupStart(), "ncclGroupStart", what);
        if (s.rank == c.root) {
          for (int peer = 0; peer < size_; ++peer) {
            std::byte* slot = static_cast<std::byte*>(gather ? out : in) + peer * block;
            if (gather)
              check_nccl(api().ncclRecv(slot, n, type, peer, s.comm, s.stream), "ncclRecv", what);
            else
              check_nccl(api().ncclSend(slot, n, type, peer, s.comm, s.stream), "ncclSend", what);
          }
        }
        if (gather)
          check_nccl(api().ncclSend(in, n, type, c.root, s.comm, s.stream), "ncclSend", what);
        else
          check_nccl(api().ncclRecv(out, n, type, c.root, s.comm, s.stream), "ncclRecv", what);
        return check_nccl(api().ncclGroupEnd(), "ncclGroupEnd", what);
      }
      case K::barrier:
        // A one-element allreduce on device scratch: NCCL has no barrier.
        if (!scratch_) check_cuda(api().cudaMallocAsync(&scratch_, sizeof(float), s.stream), "cudaMallocAsync", what);
        check_nccl(api().ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, s.comm, s.stream), "ncclAllReduce",
                   what);
        return check_cuda(api().cudaFreeAsync(scratch_, s.stream), "cudaFreeAsync", what);
      case K::send: return check_nccl(api().ncclSend(in, n, type, c.root, s.comm, s.stream), "ncclSend", what);
      case K::recv: return check_nccl(api().ncclRecv(out, n, type, c.root, s.comm, s.stream), "ncclRecv", what);
    }
  }

  std::shared_ptr<NcclState> state_;
  int size_;
  cudaEvent_t inputs_ready_ = nullptr;
  cudaEvent_t finished_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace detail

bool NcclCommunicator::available() {
  const detail::NcclLibrary* library = detail::nccl_library_if_present();
  int count = 0;
  return library != nullptr && library->cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

NcclCommunicator::NcclCommunicator(MpiCommunicator& bootstrap, int device, Options options)
    : Communicator(bootstrap.rank(), bootstrap.size(), options), state_(std::make_shared<detail::NcclState>()) {
  const std::string context = troupe::detail::concat("NCCL communicator on rank ", rank());
  detail::nccl_library(context);  // throws, saying why, where CUDA or NCCL cannot be loaded
  int devices = 0;
  check_cuda(api().cudaGetDeviceCount(&devices), "cudaGetDeviceCount", context);
  TROUPE_CHECK(devices > 0, context, ": no CUDA device is visible");
  state_->device = device >= 0 ? device : local_rank(bootstrap.comm()) % devices;
  TROUPE_CHECK(state_->device < devices, context, ": device ", state_->device, " does not exist (", devices,
               " visible)");
  check_one_rank_a_device(bootstrap, state_->device, devices, context);
  state_->rank = rank();
  check_cuda(api().cudaSetDevice(state_->device), "cudaSetDevice", context);
  check_cuda(api().cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "cudaStreamCreate", context);
  ncclUniqueId id{};
  if (rank() == 0) check_nccl(api().ncclGetUniqueId(&id), "ncclGetUniqueId", context);
  // The id travels as bytes through the bootstrap communicator's own broadcast
  // (numbered, checked in debug mode and bounded by its timeout).
  bootstrap.broadcast(Buffer(reinterpret_cast<std::uint8_t*>(&id), sizeof id), 0);
  check_nccl(api().ncclCommInitRank(&state_->comm, size(), id, rank()), "ncclCommInitRank", context);
  host_ = std::make_unique<MpiCommunicator>(bootstrap.comm(), options);
  TROUPE_MPI_CHECK(MPI_Comm_dup(bootstrap.comm(), &check_comm_));
  returning_errors(check_comm_);
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<detail::NcclState> state, std::unique_ptr<Communicator> host,
                                   MPI_Comm check_comm, int rank, int size, Options options)
    : Communicator(rank, size, options),
      state_(std::move(state)),
      host_(std::move(host)),
      check_comm_(returning_errors(check_comm)) {}

NcclCommunicator::~NcclCommunicator() {
  const bool clean = drain();
  engine().stop();
  if (!clean) state_->abort_communicator();  // a hung collective: abort rather than wait in ncclCommDestroy
  // An abandoned call's signature exchange may still be matched by a late peer.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (check_comm_ != MPI_COMM_NULL && !finalized && !engine().has_abandoned()) MPI_Comm_free(&check_comm_);
}

int NcclCommunicator::device() const { return state_->device; }

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  const std::string context = troupe::detail::concat("NCCL split on rank ", rank());
  check_cuda(api().cudaSetDevice(state_->device), "cudaSetDevice", context);
  auto child = std::make_shared<detail::NcclState>();
  child->device = state_->device;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  check_nccl(api().ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child->comm, &config),
             "ncclCommSplit", context);
  std::unique_ptr<Communicator> host_child = host_->split(color, key);  // collective too
  MPI_Comm check_child = MPI_COMM_NULL;  // every rank is here once host_'s split returned
  TROUPE_MPI_CHECK(MPI_Comm_split(check_comm_, color < 0 ? MPI_UNDEFINED : color, key, &check_child));
  if (color < 0 || child->comm == nullptr) {
    if (check_child != MPI_COMM_NULL) MPI_Comm_free(&check_child);
    return nullptr;
  }
  int rank = 0, size = 0;
  check_nccl(api().ncclCommUserRank(child->comm, &rank), "ncclCommUserRank", context);
  check_nccl(api().ncclCommCount(child->comm, &size), "ncclCommCount", context);
  child->rank = rank;
  check_cuda(api().cudaStreamCreateWithFlags(&child->stream, cudaStreamNonBlocking), "cudaStreamCreate", context);
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(std::move(child), std::move(host_child), check_child, rank, size, options()));
}

Work NcclCommunicator::start(const Collective& c, bool blocking) {
  const tensor::Device mine = tensor::Device::cuda(state_->device);
  bool on_host = false, on_device = false;
  for (const Buffer* b : {&c.input, &c.output}) {
    if (b->count == 0 || b->data == nullptr) continue;
    TROUPE_CHECK(b->device == mine || b->device.is_cpu(), c.describe(), ": a buffer is on ", b->device,
                 ", this NCCL communicator's device is ", mine, " [rank ", rank(), "]");
    (b->device.is_cpu() ? on_host : on_device) = true;
  }
  TROUPE_CHECK(!(on_host && on_device), c.describe(), ": one buffer is on the host and one on ", mine, " [rank ",
               rank(), "]; give both on the same side");
  if (on_host) return detail::reissue(*host_, c, blocking);  // numbered and checked by host_ itself
  try {
    if (options().debug && !c.is_point_to_point())
      detail::verify_signature(check_comm_, c, rank(), size(), options().timeout);
    return launch(signed_operation(c), blocking);
  } catch (const std::exception& e) {
    // A mismatch, or a failure after the call's signature went out: the ranks are out of step.
    fail(e.what());
    throw;
  }
}

std::shared_ptr<Operation> NcclCommunicator::signed_operation(const Collective& c) {
  std::shared_ptr<Operation> op = std::make_shared<detail::NcclOperation>(c, state_, size());
  if (!options().check_signatures || c.is_point_to_point()) return op;
  // The kernels are queued at once, beside the signature exchange; a mismatch aborts
  // the NCCL communicator, whose mismatched kernels would otherwise never return.
  return detail::with_signature_check(std::move(op), nullptr, check_comm_, rank(), size(), options().timeout, nullptr,
                                      [state = state_] { state->abort_communicator(); });
}

}  // namespace troupe::collectives
