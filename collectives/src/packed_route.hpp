// Small blocking calls with their signature inside the same messages, for the
// signature check across nodes (signature_check.hpp), where there is no board to
// read: an all-reduced signature beside the call costs a second round trip, as much
// as the small call itself.
//
// Every message is [ header | data ]: the header holds the signature s and -s as int64
// fields, merged by field-wise minimum, so a rank that has merged every header knows
// min(s) and max(s). The messages are troupe's own point-to-point ones, not MPI's
// collectives: every receive is posted at the longest message any packed call sends,
// so ranks whose calls differ in count (and so in message length) still finish, and
// fail alike -- MPI's collectives, given such calls, truncated on one rank and left
// the other waiting (issue 49).
//   allreduce, reduce_scatter, allgather, barrier  one exchange (recursive doubling,
//              packed_route.cpp) of the partial reduction -- a reduce_scatter's whole
//              input, of which each rank keeps its block -- or of the blocks gathered
//              so far, or of the header alone: every rank ends with every header;
//   broadcast  the root's message, forwarded down a binomial tree: each rank compares
//              the root's header with its own.
// A mismatch throws CollectiveMismatch: after an allreduce, reduce_scatter, allgather
// or barrier on every rank, naming the ranks (the signatures are allgathered on the
// check communicator); after a broadcast on the ranks that differ from the root.
// A call of another kind than its peers', or a broadcast from another root, still
// leaves MPI waiting (the watchdog's case, blocking_watchdog.hpp), as do calls on
// either side of kPackedCallBytes.
#pragma once

#include <cstddef>

#include "route.hpp"

namespace troupe::collectives::detail {

// Calls of at most this many bytes (the larger buffer) are packed: above it the
// payload's two copies cost more than the all-reduced signature saves. It also bounds
// every packed message's data, so receives are posted at kHeaderBytes + this.
constexpr std::size_t kPackedCallBytes = 4096;

class PackedRoute : public Route {
 public:
  using Route::Route;
  std::string_view name() const override { return "packed"; }
  // A small blocking allreduce, reduce_scatter, allgather, broadcast or barrier
  // (Route::small_blocking) of at most kPackedCallBytes, across nodes (no board) with
  // the signature check on.
  bool supports(const Collective& collective, bool blocking) const override;
  bool on_caller() const override { return true; }
  // Its messages travel on the check communicator (collectives only, so no other
  // message matches them), under the blocking watchdog. Throws CollectiveMismatch on a
  // mismatch.
  std::shared_ptr<Operation> run(const Collective& collective) override;
  // The proof is in the messages: each carries the headers merged so far, and a
  // peer's data is used only while they agree (packed_route.cpp).
};

}  // namespace troupe::collectives::detail
