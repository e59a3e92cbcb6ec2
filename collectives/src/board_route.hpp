// A small blocking collective on one node, carried whole by the signature board
// (shm_channel.hpp): each rank writes its data into its own board entry beside the
// call's signature, waits until every peer's entry holds the same call, and computes
// its result from the peers' entries.
//
// Why: the board already costs a cache-line write and a read of each peer's line per
// call; with the data in the same lines, that is all a call of a few bytes needs, and
// the MPI call it replaces (0.6 us for 8 bytes in Open MPI's vader, two copies through
// a FIFO) is gone. A mismatch cannot pass unseen: the data is read only once the
// signatures agree.
//
// A broadcast's root is the exception: it publishes and returns, and compares its
// peers' entries at its next call that is not such a broadcast, or once
// ShmChannel::kRootRunAhead of them are pending (ShmChannel::unverified). Two ranks
// that each take themselves for the root are told then, or on stderr when the
// communicator goes first; every other rank is told in the broadcast.
//
// Every rank reduces in rank order 0, 1, ..., n-1 (an avg divides at the last
// combine), so every rank holds the same bits. An entry is reused
// ShmChannel::kBoardEntries calls later, and only once every peer has marked the
// call checked, which it does after reading the data.
#pragma once

#include "route.hpp"

namespace troupe::collectives::detail {

class BoardRoute : public Route {
 public:
  using Route::Route;
  std::string_view name() const override { return "board"; }
  // A small blocking allreduce, reduce, reduce_scatter, allgather, broadcast or barrier
  // (Route::small_blocking) on one node with the signature check on, whose input on
  // every rank is at most Options::shm_board_bytes (capped at
  // ShmChannel::kBoardPayloadBytes). Decided from the signature alone.
  bool supports(const Collective& collective, bool blocking) const override;
  bool on_caller() const override { return true; }
  // Throws CollectiveMismatch if a peer issued another call, TimeoutError if one does
  // not come within the timeout.
  std::shared_ptr<Operation> run(const Collective& collective) override;

 private:
  // Waits until every peer's entry holds this call (the proof), before any peer's data is read.
  void verify(const Collective& collective) const;
};

}  // namespace troupe::collectives::detail
