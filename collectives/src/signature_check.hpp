// Cross-rank checks that every rank issued the same call: a collective's signature
// is (sequence, kind, count, dtype, op, root).
//
// Always on (Options::check_signatures), in one of two ways. A call is not complete
// before its signature has agreed, so a mismatch is never silent, even where the data
// of mismatched calls happened to fit.
//   On one node, the signature board of the shared-memory channel (shm_channel.hpp):
//   each rank writes the call's signature into its own entry before the call and
//   reads its peers' entries after it -- a store and a few cache-line reads, no
//   message. Any rank that sees a difference throws CollectiveMismatch, naming the
//   ranks and their calls from the entries.
//   Across nodes, the signature travels beside the call in one MPI_Iallreduce(MPI_MIN)
//   of [s, -s] on a communicator of its own, so every rank learns each field's
//   smallest and largest value -- equal only where all ranks agree. A mismatch, which
//   every rank sees alike, then runs verify_signature to name the ranks and calls.
//
// Debug mode (TROUPE_DEBUG_COLLECTIVES=1, PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL in
// spirit): before a collective starts, every rank contributes its signature to an
// allgather; if they differ, every rank throws CollectiveMismatch with the same
// message, listing which ranks issued which call, and nothing is sent.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "troupe/collectives/collective.hpp"
#include "troupe/collectives/operation.hpp"

namespace troupe::collectives::detail {

class ShmChannel;

constexpr int kSignatureFields = 6;
// (sequence, kind, count, dtype, op or -1, root or -1).
using Signature = std::array<std::int64_t, kSignatureFields>;
Signature signature_of(const Collective& collective);
// CollectiveMismatch listing which ranks issued which call.
[[noreturn]] void throw_mismatch(const Collective& collective, int rank, int size,
                                 const std::map<Signature, std::vector<int>>& ranks_by_call);

// ---- on one node: the board ----
// Writes `collective`'s signature into this rank's entry, after `payload` (at most
// ShmChannel::kBoardPayloadBytes, for board_route.hpp). First compares the broadcasts
// this rank sent as the root without waiting (ShmChannel::unverified), oldest first,
// with its peers' entries, throwing CollectiveMismatch or TimeoutError for one --
// unless this call is such a broadcast too (`root_runs_ahead`) and fewer than
// ShmChannel::kRootRunAhead are pending. Waits (bounded by `timeout`) while a peer has
// yet to check the call ShmChannel::kBoardEntries before it, whose entry this one
// reuses.
void publish_signature(ShmChannel& board, const Collective& collective, std::chrono::milliseconds timeout,
                       std::span<const std::byte> payload = {}, bool root_runs_ahead = false);
// Whether every rank's entry holds this call's signature yet (false: a rank has not
// published it); throws CollectiveMismatch if one differs. Never blocks.
bool board_agrees(ShmChannel& board, const Collective& collective);
// The call was checked another way (packed_route.hpp): its entry may be reused.
void mark_checked(ShmChannel& board, const Collective& collective);
// Without throwing: nullopt while a rank has not published the call, "" when all
// agree, else the mismatch's message (for the watchdog of a blocking call).
std::optional<std::string> board_verdict(const ShmChannel& board, const Collective& collective);
// board_agrees, polled until true (TimeoutError after `timeout`).
void wait_for_board(ShmChannel& board, const Collective& collective, std::chrono::milliseconds timeout);
// Polls until every peer's entry holds this call and agrees with it, without marking
// the call checked: the caller still reads the peers' payloads, then calls
// mark_checked. Throws CollectiveMismatch, or TimeoutError naming a rank that did
// not publish the call within `timeout`.
void wait_for_peers(ShmChannel& board, const Collective& collective, std::chrono::milliseconds timeout);

// For a communicator going away: compares ShmChannel::unverified, if any, with the
// peers' entries (waiting at most `bound` for them) and reports a mismatch, or a peer
// that never issued the call, on stderr. Never throws.
void settle_unverified(ShmChannel& board, std::chrono::milliseconds bound) noexcept;

// ---- across nodes: an all-reduce of the signatures ----
// One call's signature exchange, in flight.
class SignatureExchange {
 public:
  explicit SignatureExchange(const Collective& collective);
  SignatureExchange(const SignatureExchange&) = delete;
  SignatureExchange& operator=(const SignatureExchange&) = delete;
  void start(MPI_Comm comm);
  // True once every rank's signature has been reduced (never blocks).
  bool test();
  // After test() returned true: whether every rank issued the same call.
  bool agreed() const;

 private:
  static constexpr int kFields = 6;
  std::array<std::int64_t, 2 * kFields> send_{}, received_{};
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// On the caller's thread, for an exchange started before a blocking call: waits for
// it (bounded by `timeout`: then TimeoutError, and `exchange` must be kept, as MPI may
// still write to it) and throws what verify_signature throws on a mismatch.
void finish_signature_check(SignatureExchange& exchange, MPI_Comm comm, const Collective& collective, int rank,
                            int size, std::chrono::milliseconds timeout);

// After the call it travelled with failed (calls of different sizes can fail inside
// MPI before their signatures meet): waits a moment for `exchange` and throws the
// mismatch if that is what it shows; returns otherwise, for the caller to rethrow.
void throw_if_mismatched(SignatureExchange& exchange, MPI_Comm comm, const Collective& collective, int rank, int size,
                         std::chrono::milliseconds timeout);

// The order in which checked-first operations (below) start their MPI calls: the
// order they were issued in, as MPI matches collectives by posting order.
struct StartOrder {
  std::uint64_t issued = 0, started = 0;
};

// `inner`, with its signature checked -- on `board` when there is one, else exchanged
// on `comm`: done when both are. A mismatch is the error even when `inner` finished,
// or failed, first (two calls of different sizes can fail inside MPI before their
// signatures meet). With `order`, `inner` starts only once the signatures agree, in
// issue order: Open MPI's non-blocking collectives given calls of different sizes
// abort the job through MPI_COMM_WORLD's handler, whatever the communicator's says.
// `on_mismatch` runs once, on the thread that found a mismatch, before it throws: NCCL
// aborts its communicator there, as mismatched kernels would spin on the GPU for ever.
// A device wait (Operation::queue_device_wait) goes to `inner`; the check then ends
// when the engine next progresses the call, and a mismatch fails a later wait or call.
std::shared_ptr<Operation> with_signature_check(std::shared_ptr<Operation> inner, ShmChannel* board, MPI_Comm comm,
                                                int rank, int size, std::chrono::milliseconds timeout,
                                                std::shared_ptr<StartOrder> order = nullptr,
                                                std::function<void()> on_mismatch = {});

// Throws CollectiveMismatch on a mismatch, TimeoutError if not every rank arrives in time.
void verify_signature(MPI_Comm comm, const Collective& collective, int rank, int size,
                      std::chrono::milliseconds timeout);

}  // namespace troupe::collectives::detail
