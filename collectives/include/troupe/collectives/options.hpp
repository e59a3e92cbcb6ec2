// Options of a Communicator. Every field says why it exists; the defaults are what
// the benchmark (bench/collectives_bench.cpp) measured as best on 2-core VMs.
#pragma once

#include <chrono>
#include <cstddef>

namespace troupe::collectives {

inline constexpr std::chrono::milliseconds kNoTimeout = std::chrono::milliseconds::max();

struct Options {
  // How long a blocking call, or Work::wait() without an argument, waits before it
  // throws TimeoutError and fails the communicator. A hang becomes an error naming the
  // collective instead of a job that never ends (a small blocking call that went
  // straight to MPI aborts instead: see direct_blocking_bytes). kNoTimeout waits forever.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);

  // Check at every collective that all ranks issued the same call (sequence, kind,
  // count, dtype, op, root): the signatures are reduced beside the data, one small
  // all-reduce per call, and a call is complete only once they agree; a mismatch fails
  // every rank with CollectiveMismatch naming the ranks and their calls. On by default;
  // TROUPE_CHECK_COLLECTIVES=0 turns it off (what it costs: docs/BENCHMARKS.md).
  bool check_signatures = true;

  // Verify before every collective, with an allgather of the signatures, that all ranks
  // issued the same call, and send nothing otherwise. Costs one small allgather per
  // call, so it is off unless asked for; the environment variable
  // TROUPE_DEBUG_COLLECTIVES=1 turns it on for every communicator.
  bool debug = false;

  // Allreduces and reduce_scatters of at least this many bytes (the larger buffer)
  // use the pipelined ring (allreduce_ring.hpp) instead of MPI's non-blocking
  // call, where shared memory does not serve them. Below it MPI's own
  // latency-optimised algorithms win; above it MPI streams whole buffers through
  // memory (and its reduce_scatter over TCP crawls at 0.1 GB/s), while the ring works
  // in cache-sized segments. Tests set 0 to force the ring.
  std::size_t ring_threshold_bytes = std::size_t{1} << 20;

  // Bytes per message in the ring. Small enough that a received segment is still in
  // cache when it is reduced, large enough to amortise a message's fixed cost. Kept
  // settable so that tests reach the multi-segment paths with small buffers (gloo's
  // maxSegmentSize).
  std::size_t segment_bytes = std::size_t{256} << 10;

  // Segments in flight per direction in the ring; more hides latency, fewer keeps the
  // receive slots in cache.
  int ring_window = 4;

  // When every rank of the communicator is on one node, run allreduce, reduce,
  // reduce_scatter, allgather and broadcast through shared memory that the ranks map
  // from each other (shm_channel.hpp) instead of MPI: each rank copies its data once
  // and its peers read it in place, where Open MPI copies every message twice.
  // options_from_environment() turns it off when TROUPE_COLLECTIVES_SHM=0, or when
  // Open MPI was told not to use shared memory (OMPI_MCA_btl without vader/sm, as
  // `--mca btl self,tcp` sets it): whoever asks for TCP on one node is emulating a
  // network and means to measure or test that path.
  bool shared_memory = true;

  // Bytes per shared-memory slot (one round of a collective per rank) and slots per
  // rank: a round's data should still be in cache when the peers read it, and several
  // rounds in flight let copying and reducing on the ranks overlap.
  std::size_t shm_slot_bytes = std::size_t{256} << 10;
  int shm_slots = 4;

  // Blocking collectives on one node whose input holds at most this many bytes (4 KB
  // at most) travel whole in the signature board's entries (board_route.hpp), beside
  // the signature the check publishes anyway: one write and one read per peer, no MPI
  // call. Needs check_signatures (it is the check's board); 0 sends them to MPI as
  // direct_blocking_bytes says.
  std::size_t shm_board_bytes = 4096;

  // Run a background thread that drives MPI progress while async collectives are in
  // flight and nobody waits on them, so that communication overlaps computation (Open
  // MPI moves data only inside MPI calls). It sleeps on a condition variable when idle
  // and backs off while polling.
  bool progress_thread = true;

  // Blocking collectives (not send/recv) whose larger buffer holds at most this many
  // bytes call MPI's blocking function (MPI_Allreduce, MPI_Barrier, ...) on the
  // caller's thread when debug is off, after finishing whatever async work is still in
  // flight (so that every rank makes the same choice: MPI never matches a blocking
  // collective with a non-blocking one): Open MPI's non-blocking collectives cost 2-3x
  // more at small sizes, where latency is everything. MPI cannot
  // interrupt such a call, so its timeout is kept by a watchdog thread that, when the
  // call overruns Options::timeout, prints which collective hung (name, sequence
  // number, size, rank) and aborts the job, as PyTorch's NCCL watchdog does; the
  // supervisor then restarts it. 0 sends every call through the non-blocking path,
  // where a timeout is a TimeoutError instead.
  std::size_t direct_blocking_bytes = std::size_t{64} << 10;
};

// Options with `debug` taken from TROUPE_DEBUG_COLLECTIVES (1/true/on) and
// `check_signatures` from TROUPE_CHECK_COLLECTIVES.
Options options_from_environment();

}  // namespace troupe::collectives
