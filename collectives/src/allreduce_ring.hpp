// The ring route (RingRoute): allreduce as a reduce-scatter followed by an allgather
// around a ring of ranks, pipelined in segments over MPI point-to-point messages -- and
// the first half alone, as reduce_scatter. It carries allreduces, reduces and
// reduce_scatters of at least Options::ring_threshold_bytes (a reduce by its count,
// which every rank has, not by a buffer that ranks other than the root may leave
// empty; an allreduce or a reduce needs an element per rank for its blocks) that
// shared memory does not: ranks on different nodes, or a job that turned it off.
//
// The buffer is cut into n blocks (n ranks) and each block into m segments of at most
// Options::segment_bytes. Step k of 2(n-1) moves one block from each rank to its right
// neighbour, segment by segment:
//
//   reduce-scatter, k = 0 .. n-2: rank r sends block (r-k) and receives block (r-k-1)
//     from its left neighbour into a small receive slot, then reduces it with its own
//     input into the output. After n-1 steps rank r holds block (r+1) fully reduced
//     (for avg, the last step also divides by n: one rounding, the same bits everywhere).
//   allgather, k = n-1 .. 2n-3 (t = k-n+1): rank r sends block (r+1-t) and receives
//     block (r-t) straight into the output.
//
// Alone, the reduce-scatter runs with every block index shifted by one, so that rank r
// ends with block r, as reduce_scatter defines; it keeps its partial sums in a scratch
// copy of the blocks (the output is one block) and copies block r out at the end.
//
// A reduce runs as the whole allreduce; a rank other than the root keeps the blocks in
// a scratch buffer and drops them at the end. That moves what an allreduce moves, twice
// a pipelined tree's bytes at large n, but Open MPI's non-blocking reduce advances one
// segment per poll: beside stress-ng an 8 MB reduce at 2 ranks took about 5 s (a
// scheduler slice per segment), where the ring took 0.05 s.
//
// An allgather alone is not run here: it has nothing to reduce in cache, and over TCP
// MPI's own non-blocking allgather (one message per peer) ran at 0.89-1.16x the
// blocking MPI_Allgather at 2-256 MB where this ring's 256 KB segments ran at 0.49-0.62x
// (bench/run collectives, 2026-11-25; 4 MB segments: 0.67-1.14x).
//
// Why segments: MPI_Allreduce on large buffers streams each whole buffer through
// memory several times. Here a segment is received into one of `window` slots that stay
// in cache and is reduced at once, and segment j of step k+1 leaves as soon as segment
// j of step k is reduced, so copying, reducing and sending overlap. (Over TCP, where
// this ring now serves, Open MPI's reduce_scatter moved 0.1 GB/s past 16 MB.)
//
// Matching: every rank posts its sends, and its receives, in the same order — index
// k*m + j — with one tag per collective (its sequence number), so MPI's non-overtaking
// rule pairs the i-th send of the left neighbour with our i-th receive. Dependencies,
// all on lower indices: send (k, j) waits for receive (k-1, j) to be reduced; an
// allgather receive into block (r-t) waits for the send of that block at step t to
// complete, since both use the same memory.
//
// The proof runs beside the ring (with_signature_check): the signatures are exchanged
// on the check communicator while the segments move, and the call is done only when
// both are. Each poll of the call tests the exchange too, so a mismatch ends the call
// as soon as it shows, while the segments of calls of different sizes still wait.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "route.hpp"
#include "troupe/collectives/operation.hpp"

namespace troupe::collectives::detail {

class RingRoute : public EngineRoute {
 public:
  explicit RingRoute(const RouteSite& site) : EngineRoute(site, /*agree_first=*/false) {}
  std::string_view name() const override { return "ring"; }
  bool supports(const Collective& collective, bool blocking) const override;
  std::shared_ptr<Operation> run(const Collective& collective) override;
};

class AllreduceRing : public Operation {
 public:
  // The collective is an allreduce, a reduce or a reduce_scatter.
  AllreduceRing(Collective collective, MPI_Comm comm, int rank, int size, std::size_t segment_bytes, int window,
                int tag);
  ~AllreduceRing() override;

  void start() override;
  bool progress() override;
  std::string waiting_on() const override;

 private:
  struct Pending {
    MPI_Request request;
    int slot;  // receive slot, or -1
  };

  std::byte* segment(std::byte* base, int block, std::size_t j, std::size_t* elements) const;
  bool send_ready(std::size_t index) const;
  bool recv_ready(std::size_t index) const;
  void post_send(std::size_t index);
  void post_recv(std::size_t index);
  void complete_recv(std::size_t index, int slot);
  int send_block(std::size_t step) const;
  int recv_block(std::size_t step) const;
  // Whether step `step` is of the reduce-scatter half.
  bool reducing(std::size_t step) const;
  // Where partial sums and gathered blocks live: the output, or for a reduce_scatter
  // (and a reduce off its root) the scratch copy of every block.
  std::byte* blocks() const;

  MPI_Comm comm_;
  int rank_, size_, left_, right_, tag_;
  bool gather_half_;  // an allreduce's (or a reduce's) second half runs
  int shift_;         // 0 for an allreduce or a reduce; -1 for a reduce_scatter
  std::size_t element_bytes_;
  std::size_t segment_elements_;
  std::size_t segments_per_block_ = 0;     // m
  std::size_t total_ = 0;                  // messages each way: 2(n-1) * m
  std::vector<std::size_t> block_offset_;  // n+1 entries, in elements
  std::size_t window_;

  std::unique_ptr<std::byte[]> slots_;
  std::unique_ptr<std::byte[]> scratch_;  // reduce_scatter's blocks; a reduce's off the root
  std::vector<int> free_slots_;
  std::deque<Pending> sends_, recvs_;
  std::size_t next_send_ = 0, next_recv_ = 0, sends_done_ = 0, recvs_done_ = 0;
};

}  // namespace troupe::collectives::detail
