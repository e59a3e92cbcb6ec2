// The Communicator front end: builds a Collective from each call, checks it on the
// caller's thread (so a bad call fails where it was made, before anything is sent),
// numbers it and hands it to the backend.
#include "troupe/collectives/communicator.hpp"

#include <cstdio>

#include <cstring>
#include <vector>

#include "engine.hpp"
#include "flight_recorder.hpp"
#include "troupe/collectives/collective_error.hpp"
#include "troupe/collectives/operation.hpp"

namespace troupe::collectives {

namespace {

using K = CollectiveKind;

Collective make(K kind, Buffer input, Buffer output, DType dtype) {
  Collective c;
  c.kind = kind;
  c.input = input;
  c.output = output;
  c.dtype = dtype;
  return c;
}

bool is_slice_of(const Buffer& part, const Buffer& whole, int index) {
  return part.data != nullptr &&
         part.bytes() == whole.bytes() + static_cast<std::size_t>(index) * part.count * element_size(part.dtype);
}

void check_buffer(std::string_view name, const Buffer& b, const char* which) {
  TROUPE_CHECK(b.data != nullptr || b.count == 0, name, ": ", which, " buffer is null but holds ", b.count,
               " elements");
}

void check_same_kind(std::string_view name, const Buffer& input, const Buffer& output) {
  TROUPE_CHECK(input.dtype == output.dtype, name, ": input is ", input.dtype, " but output is ", output.dtype);
  TROUPE_CHECK(input.device == output.device, name, ": input is on ", input.device, " but output is on ",
               output.device);
}

void check_root(std::string_view name, int root, int size) {
  TROUPE_CHECK(root >= 0 && root < size, name, ": root ", root, " is not a rank of this communicator of size ", size);
}

// Copies rank i's block of a flat allgather result into outputs[i].
class ScatterToOutputs : public Operation {
 public:
  ScatterToOutputs(Collective c, std::shared_ptr<std::vector<std::byte>> staging, std::vector<Buffer> outputs,
                   Work gather)
      : Operation(std::move(c)),
        staging_(std::move(staging)),
        outputs_(std::move(outputs)),
        gather_(std::move(gather)) {}
  void start() override {}
  bool progress() override {
    // The flat allgather runs just before this on the same engine, which advances
    // operations in order: once it is done we copy (or pass its error on).
    if (!gather_.is_completed()) return false;
    if (auto error = gather_.exception()) std::rethrow_exception(error);
    const std::size_t block = collective().count * element_size(collective().dtype);
    for (std::size_t i = 0; i < outputs_.size(); ++i) {
      if (block) std::memcpy(outputs_[i].data, staging_->data() + i * block, block);
    }
    return true;
  }

 private:
  std::shared_ptr<std::vector<std::byte>> staging_;
  std::vector<Buffer> outputs_;
  Work gather_;
};

}  // namespace

Communicator::Communicator(int rank, int size, Options options)
    : rank_(rank),
      size_(size),
      options_(options),
      engine_(std::make_shared<detail::Engine>(options, rank, size)),
      flights_(std::make_unique<detail::FlightRecorder>()) {}

Communicator::~Communicator() {
  drain();
  engine_->stop();
}

static_assert(Communicator::kFlightRecord == detail::FlightRecorder::kSize);

std::vector<std::string> Communicator::flight_record() const { return flights_->lines(); }

void Communicator::set_tracer(Tracer* tracer, std::string track) { engine_->set_tracer(tracer, std::move(track)); }

void Communicator::run(Collective&& collective) {
  std::size_t slot = 0;
  Work work = submit(std::move(collective), true, &slot);
  work.wait();
  flights_->finished(slot, work.sequence());
}

bool Communicator::failed() const { return engine_->failed(); }

std::chrono::nanoseconds Communicator::wait_time() const { return engine_->waited(); }

std::uint64_t Communicator::host_waits() const { return engine_->blocked_waits(); }

void Communicator::fail(const std::string& reason) { engine_->fail(reason); }

bool Communicator::drain() noexcept { return engine_->drain(options_.timeout); }

Work Communicator::launch(std::shared_ptr<Operation> operation, bool blocking) {
  engine_->launch(operation, blocking);
  return Work(std::move(operation));
}

Work Communicator::submit(Collective&& c, bool blocking, std::size_t* slot) {
  const std::string_view name = collective_name(c.kind);
  if (engine_->failed()) {
    TROUPE_THROW(CommunicatorFailed, name, " on rank ", rank_,
                 ": the communicator failed earlier: ", engine_->failure());
  }
  const int n = size_;
  // broadcast and reduce: a valid root, where input and output must match in kind and size.
  const auto check_rooted = [&](const Collective& rooted) {
    check_root(name, rooted.root, n);
    if (rank_ != rooted.root) return;
    check_same_kind(name, rooted.input, rooted.output);
    TROUPE_CHECK(rooted.input.count == rooted.output.count, name, ": size mismatch on root ", rooted.root,
                 ", input has ", rooted.input.count, " elements, output ", rooted.output.count);
  };
  switch (c.kind) {
    case K::allreduce:
      check_same_kind(name, c.input, c.output);
      TROUPE_CHECK(c.input.count == c.output.count, name, ": size mismatch, input has ", c.input.count,
                   " elements, output ", c.output.count);
      c.count = c.output.count;
      c.in_place = c.input.data == c.output.data;
      break;
    case K::broadcast:
      check_rooted(c);
      c.count = c.output.count;
      c.in_place = c.input.data == c.output.data;
      break;
    case K::reduce:
      check_rooted(c);
      c.count = c.input.count;
      c.in_place = c.input.data == c.output.data;
      break;
    case K::allgather:
      check_same_kind(name, c.input, c.output);
      TROUPE_CHECK(c.output.count == c.input.count * n, name, ": size mismatch, output has ", c.output.count,
                   " elements but ", n, " ranks x ", c.input.count, " input elements = ", c.input.count * n);
      c.count = c.input.count;
      c.in_place = is_slice_of(c.input, c.output, rank_);
      break;
    case K::reduce_scatter:
      check_same_kind(name, c.input, c.output);
      TROUPE_CHECK(c.input.count == c.output.count * n, name, ": size mismatch, input has ", c.input.count,
                   " elements but ", n, " ranks x ", c.output.count, " output elements = ", c.output.count * n);
      c.count = c.output.count;
      c.in_place = is_slice_of(c.output, c.input, rank_);
      break;
    case K::gather:
      check_root(name, c.root, n);
      if (rank_ == c.root) {
        check_same_kind(name, c.input, c.output);
        TROUPE_CHECK(c.output.count == c.input.count * n, name, ": size mismatch on root ", c.root, ", output has ",
                     c.output.count, " elements but ", n, " ranks x ", c.input.count, " = ", c.input.count * n);
        c.in_place = is_slice_of(c.input, c.output, rank_);
      }
      c.count = c.input.count;
      break;
    case K::scatter:
      check_root(name, c.root, n);
      if (rank_ == c.root) {
        check_same_kind(name, c.input, c.output);
        TROUPE_CHECK(c.input.count == c.output.count * n, name, ": size mismatch on root ", c.root, ", input has ",
                     c.input.count, " elements but ", n, " ranks x ", c.output.count, " = ", c.output.count * n);
        c.in_place = is_slice_of(c.output, c.input, rank_);
      }
      c.count = c.output.count;
      break;
    case K::barrier: break;
    case K::send:
    case K::recv:
      TROUPE_CHECK(c.root >= 0 && c.root < n, name, ": peer ", c.root, " is not a rank of this communicator of size ",
                   n);
      TROUPE_CHECK(c.tag >= 0, name, ": tag ", c.tag, " is negative");
      c.count = c.kind == K::send ? c.input.count : c.output.count;
      break;
  }
  check_buffer(name, c.input, "input");
  check_buffer(name, c.output, "output");
  if (c.has_op()) check_reduce_op(c.op, c.dtype, name);
  // The number is spent only once the backend accepted the call: its own checks
  // (devices, MPI limits) throw before anything is sent, and the ranks must stay in step.
  std::lock_guard lock(submit_mutex_);
  std::uint64_t& counter = c.is_point_to_point() ? p2p_sequence_ : sequence_;
  c.sequence = counter;
  // Recorded before start(): a blocking backend may not return until it is done.
  const std::size_t recorded = flights_->record(c);
  const std::int64_t traced_begin = engine_->tracing() ? Tracer::now_ns() : 0;
  Work work = start(c, blocking);
  ++counter;
  // A call the engine never saw (finished on this thread) is a span here; the engine
  // records the ones it launched as they finish.
  if (traced_begin != 0 && !work.operation_) engine_->record_finished_on_caller(c, traced_begin);
  if (work.is_completed())
    flights_->finished(recorded, c.sequence);
  else if (!blocking)
    flights_->watch(recorded, c.sequence, work.operation_);  // a blocking call's run() marks it
  if (slot != nullptr) *slot = recorded;
  return work;
}

// ---- the public forms: each builds its Collective and submits it ----

Work Communicator::allreduce_async(Buffer input, Buffer output, ReduceOp op) {
  Collective c = make(K::allreduce, input, output, output.dtype);
  c.op = op;
  return submit(std::move(c), false);
}
Work Communicator::allreduce_async(Buffer inout, ReduceOp op) { return allreduce_async(inout, inout, op); }
void Communicator::allreduce(Buffer input, Buffer output, ReduceOp op) {
  Collective c = make(K::allreduce, input, output, output.dtype);
  c.op = op;
  run(std::move(c));
}
void Communicator::allreduce(Buffer inout, ReduceOp op) { allreduce(inout, inout, op); }

static Collective make_rooted(K kind, Buffer input, Buffer output, int root, DType dtype) {
  Collective c = make(kind, input, output, dtype);
  c.root = root;
  return c;
}

Work Communicator::broadcast_async(Buffer input, Buffer output, int root) {
  return submit(make_rooted(K::broadcast, input, output, root, output.dtype), false);
}
Work Communicator::broadcast_async(Buffer inout, int root) { return broadcast_async(inout, inout, root); }
void Communicator::broadcast(Buffer input, Buffer output, int root) {
  run(make_rooted(K::broadcast, input, output, root, output.dtype));
}
void Communicator::broadcast(Buffer inout, int root) { broadcast(inout, inout, root); }

Work Communicator::reduce_async(Buffer input, Buffer output, int root, ReduceOp op) {
  Collective c = make_rooted(K::reduce, input, output, root, input.dtype);
  c.op = op;
  return submit(std::move(c), false);
}
Work Communicator::reduce_async(Buffer inout, int root, ReduceOp op) { return reduce_async(inout, inout, root, op); }
void Communicator::reduce(Buffer input, Buffer output, int root, ReduceOp op) {
  Collective c = make_rooted(K::reduce, input, output, root, input.dtype);
  c.op = op;
  run(std::move(c));
}
void Communicator::reduce(Buffer inout, int root, ReduceOp op) { reduce(inout, inout, root, op); }

Work Communicator::allgather_async(Buffer input, Buffer output) {
  return submit(make(K::allgather, input, output, input.dtype), false);
}
Work Communicator::allgather_async(Buffer inout) {
  TROUPE_CHECK(inout.count % size_ == 0, "allgather: in-place buffer of ", inout.count,
               " elements does not split into ", size_, " equal blocks");
  const std::size_t c = inout.count / size_;
  return allgather_async(inout.slice(rank_ * c, c), inout);
}
void Communicator::allgather(Buffer input, Buffer output) { run(make(K::allgather, input, output, input.dtype)); }
void Communicator::allgather(Buffer inout) { allgather_async(inout).wait(); }

Work Communicator::allgather_async(Buffer input, std::span<const Buffer> outputs) {
  // The staging buffer is host memory, copied with memcpy.
  TROUPE_CHECK(input.device.is_cpu(), "allgather into separate outputs takes host buffers, but the input is on ",
               input.device, "; for CUDA buffers gather into one flat output and take views of it");
  TROUPE_CHECK(outputs.size() == static_cast<std::size_t>(size_), "allgather: ", outputs.size(),
               " output buffers given for ", size_, " ranks");
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    TROUPE_CHECK(outputs[i].count == input.count, "allgather: output ", i, " has ", outputs[i].count,
                 " elements, input ", input.count);
    check_same_kind("allgather", input, outputs[i]);
    check_buffer("allgather", outputs[i], "output");
  }
  auto staging = std::make_shared<std::vector<std::byte>>(input.nbytes() * size_);
  Buffer flat(staging->data(), input.count * size_, input.dtype, input.device);
  Work gather = allgather_async(input, flat);
  Collective copy = make(K::allgather, input, flat, input.dtype);
  copy.count = input.count;
  copy.sequence = gather.sequence();
  return launch(std::make_shared<ScatterToOutputs>(copy, staging, std::vector<Buffer>(outputs.begin(), outputs.end()),
                                                   std::move(gather)),
                false);
}
void Communicator::allgather(Buffer input, std::span<const Buffer> outputs) { allgather_async(input, outputs).wait(); }

Work Communicator::reduce_scatter_async(Buffer input, Buffer output, ReduceOp op) {
  Collective c = make(K::reduce_scatter, input, output, input.dtype);
  c.op = op;
  return submit(std::move(c), false);
}
Work Communicator::reduce_scatter_async(Buffer inout, ReduceOp op) {
  TROUPE_CHECK(inout.count % size_ == 0, "reduce_scatter: in-place buffer of ", inout.count,
               " elements does not split into ", size_, " equal blocks");
  const std::size_t c = inout.count / size_;
  return reduce_scatter_async(inout, inout.slice(rank_ * c, c), op);
}
void Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  Collective c = make(K::reduce_scatter, input, output, input.dtype);
  c.op = op;
  run(std::move(c));
}
void Communicator::reduce_scatter(Buffer inout, ReduceOp op) { reduce_scatter_async(inout, op).wait(); }

Work Communicator::gather_async(Buffer input, Buffer output, int root) {
  return submit(make_rooted(K::gather, input, output, root, input.dtype), false);
}
void Communicator::gather(Buffer input, Buffer output, int root) {
  run(make_rooted(K::gather, input, output, root, input.dtype));
}

Work Communicator::scatter_async(Buffer input, Buffer output, int root) {
  return submit(make_rooted(K::scatter, input, output, root, output.dtype), false);
}
void Communicator::scatter(Buffer input, Buffer output, int root) {
  run(make_rooted(K::scatter, input, output, root, output.dtype));
}

Work Communicator::barrier_async() { return submit(make(K::barrier, {}, {}, DType::u8), false); }
void Communicator::barrier() { run(make(K::barrier, {}, {}, DType::u8)); }

Work Communicator::send_async(Buffer input, int peer, int tag) {
  Collective c = make_rooted(K::send, input, {}, peer, input.dtype);
  c.tag = tag;
  return submit(std::move(c), false);
}
Work Communicator::recv_async(Buffer output, int peer, int tag) {
  Collective c = make_rooted(K::recv, {}, output, peer, output.dtype);
  c.tag = tag;
  return submit(std::move(c), false);
}
void Communicator::send(Buffer input, int peer, int tag) {
  Collective c = make_rooted(K::send, input, {}, peer, input.dtype);
  c.tag = tag;
  run(std::move(c));
}
void Communicator::recv(Buffer output, int peer, int tag) {
  Collective c = make_rooted(K::recv, {}, output, peer, output.dtype);
  c.tag = tag;
  run(std::move(c));
}

}  // namespace troupe::collectives
