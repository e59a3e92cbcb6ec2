// Communicator: a group of ranks that run collectives together (c10d's ProcessGroup).
//
// Contract, as for MPI: every rank of the communicator issues the same collectives in
// the same order, with the same element count, dtype, reduction and root. Each call gets
// the next sequence number; with Options::debug (TROUPE_DEBUG_COLLECTIVES=1) ranks check
// that they agree at every number and throw CollectiveMismatch naming who differs.
// Calls may come from several threads, but then their order is whatever the threads
// make it, so issue them from one thread per communicator.
//
// Every collective has a blocking form and an `_async` form that returns a Work handle
// (work.hpp). Arguments are checked on the calling thread before anything is sent;
// a bad call throws InvalidArgument and does not consume a sequence number. A blocking
// call waits up to Options::timeout, then throws TimeoutError and fails the communicator
// (CommunicatorFailed from then on), never hangs silently.
//
// Buffers are views (buffer.hpp); the caller keeps them alive until the work completes.
// Layouts, with n = size() and c the per-rank count:
//   allreduce       input c, output c.               In place: one buffer.
//   broadcast       root's input c -> output c.      In place: one buffer.
//   reduce          input c -> root's output c (others may pass an empty output).
//   allgather       input c -> output n*c, rank i's input at [i*c, (i+1)*c).
//                   In place: the input is the output's own slice (or pass one buffer).
//   reduce_scatter  input n*c -> output c, rank i gets block i.
//                   In place: the output is the input's own slice (or pass one buffer).
//   gather          input c -> root's output n*c. In place on root: own slice.
//   scatter         root's input n*c -> output c. In place on root: own slice.
//   send/recv       point to point, matched by (peer, tag); not part of the sequence.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/collectives/buffer.hpp"
#include "troupe/collectives/collective.hpp"
#include "troupe/collectives/options.hpp"
#include "troupe/collectives/reduce_op.hpp"
#include "troupe/collectives/work.hpp"

namespace troupe {
class Tracer;
}

namespace troupe::collectives {

namespace detail {
class Engine;
class FlightRecorder;
}  // namespace detail

class Communicator {
 public:
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Waits for collectives still in flight (up to Options::timeout), then releases the
  // backend's resources. Never throws.
  virtual ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Options& options() const { return options_; }
  // "mpi", "nccl", "single-rank".
  virtual std::string_view backend() const = 0;
  // True once a collective timed out or failed; every later call throws CommunicatorFailed.
  bool failed() const;
  // The sequence number the next collective will get.
  std::uint64_t next_sequence() const { return sequence_; }
  // How long callers have waited, in total, for collectives that were not done yet when
  // they came to wait (Work::wait and the blocking forms). A step's time less this is
  // the rank's own work in it: a straggler waits least (troupe-run's straggler report).
  std::chrono::nanoseconds wait_time() const;
  // How many times a caller blocked on a collective not yet done (the waits wait_time
  // sums): what Work::wait_on_device spares the host on a GPU.
  std::uint64_t host_waits() const;

  // The flight recorder: the last kFlightRecord collectives (and sends/receives) this
  // rank issued on this communicator, oldest first, one line each --
  //   "allreduce #12 (sum, 1023 x f32 = 4092 B): started 1.204 s ago, done"
  //   "allreduce #13 (sum, 1023 x f32 = 4092 B): in flight for 5.310 s"
  // -- what a hang dump shows (docs/OBSERVABILITY.md). Any thread, any time, never
  // waiting for a call in progress (flight_recorder.hpp).
  static constexpr std::size_t kFlightRecord = 64;
  std::vector<std::string> flight_record() const;

  // Timeline spans (troupe/trace.hpp): every collective launched while `tracer`
  // records, on a row named `track` ("world collectives"), and every wait for one, on
  // the waiting thread. The tracer must outlive the communicator or be unset (null).
  void set_tracer(Tracer* tracer, std::string track);

  // Ranks with the same color form a new communicator, ordered by (key, old rank).
  // Collective over this communicator. A negative color returns null (no membership).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  void allreduce(Buffer inout, ReduceOp op = ReduceOp::sum);
  void allreduce(Buffer input, Buffer output, ReduceOp op = ReduceOp::sum);
  Work allreduce_async(Buffer inout, ReduceOp op = ReduceOp::sum);
  Work allreduce_async(Buffer input, Buffer output, ReduceOp op = ReduceOp::sum);

  void broadcast(Buffer inout, int root);
  void broadcast(Buffer input, Buffer output, int root);
  Work broadcast_async(Buffer inout, int root);
  Work broadcast_async(Buffer input, Buffer output, int root);

  void reduce(Buffer inout, int root, ReduceOp op = ReduceOp::sum);
  void reduce(Buffer input, Buffer output, int root, ReduceOp op = ReduceOp::sum);
  Work reduce_async(Buffer inout, int root, ReduceOp op = ReduceOp::sum);
  Work reduce_async(Buffer input, Buffer output, int root, ReduceOp op = ReduceOp::sum);

  void allgather(Buffer inout);
  void allgather(Buffer input, Buffer output);
  // Into one buffer per rank: `outputs[i]` receives rank i's input (through a flat
  // staging buffer, so this form costs one extra copy).
  void allgather(Buffer input, std::span<const Buffer> outputs);
  Work allgather_async(Buffer inout);
  Work allgather_async(Buffer input, Buffer output);
  Work allgather_async(Buffer input, std::span<const Buffer> outputs);

  void reduce_scatter(Buffer inout, ReduceOp op = ReduceOp::sum);
  void reduce_scatter(Buffer input, Buffer output, ReduceOp op = ReduceOp::sum);
  Work reduce_scatter_async(Buffer inout, ReduceOp op = ReduceOp::sum);
  Work reduce_scatter_async(Buffer input, Buffer output, ReduceOp op = ReduceOp::sum);

  void gather(Buffer input, Buffer output, int root);
  Work gather_async(Buffer input, Buffer output, int root);

  void scatter(Buffer input, Buffer output, int root);
  Work scatter_async(Buffer input, Buffer output, int root);

  void barrier();
  Work barrier_async();

  void send(Buffer input, int peer, int tag = 0);
  void recv(Buffer output, int peer, int tag = 0);
  Work send_async(Buffer input, int peer, int tag = 0);
  Work recv_async(Buffer output, int peer, int tag = 0);

 protected:
  Communicator(int rank, int size, Options options);

  // The backend's part: checks what only it knows (devices), then starts the
  // collective and returns its handle. Called after the common checks, with
  // `collective.sequence` assigned.
  virtual Work start(const Collective& collective, bool blocking) = 0;
  // Fails the communicator (after a timeout the backend saw itself, say).
  void fail(const std::string& reason);

  // Runs `operation` on this communicator's engine (for backends built on Operation).
  // `blocking`: the caller waits right away, so the progress thread is not woken.
  Work launch(std::shared_ptr<Operation> operation, bool blocking);
  detail::Engine& engine() { return *engine_; }
  // Waits for everything in flight; for backends' destructors, before they free
  // what operations use. Returns false if something was still running at the timeout.
  bool drain() noexcept;

 private:
  // Checks `collective`, numbers it and hands it to start(). Taken by reference: the
  // public forms build it once, and a copy through each layer cost a small
  // broadcast ~30 ns of store-forwarding stalls (a third of its overhead over MPI).
  // `slot`: where the flight recorder keeps the call.
  Work submit(Collective&& collective, bool blocking, std::size_t* slot = nullptr);
  void run(Collective&& collective);

  int rank_;
  int size_;
  Options options_;
  std::mutex submit_mutex_;         // numbering and starting are one step
  std::uint64_t sequence_ = 0;      // next collective
  std::uint64_t p2p_sequence_ = 0;  // next send/recv
  std::shared_ptr<detail::Engine> engine_;
  std::unique_ptr<detail::FlightRecorder> flights_;
};

// The CPU communicator over MPI_COMM_WORLD: the single-rank backend when the world has
// one rank, else the MPI backend. MPI must be initialised (troupe::mpi::Environment).
std::unique_ptr<Communicator> world_communicator(Options options = options_from_environment());

}  // namespace troupe::collectives
