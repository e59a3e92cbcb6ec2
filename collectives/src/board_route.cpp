#include "board_route.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>

#include "reduce_kernels.hpp"
#include "shm_channel.hpp"
#include "signature_check.hpp"

namespace troupe::collectives::detail {

namespace {

using K = CollectiveKind;

// The bytes each rank publishes: the whole input, or nothing (broadcast's non-roots,
// barrier). Computed from the signature, not from the buffers, which non-roots may
// leave empty.
std::size_t payload_bytes(const Collective& c, int size) {
  const std::size_t element = element_size(c.dtype);
  switch (c.kind) {
    case K::allreduce:
    case K::reduce:
    case K::allgather:
    case K::broadcast: return c.count * element;
    case K::reduce_scatter: return c.count * static_cast<std::size_t>(size) * element;
    case K::barrier: return 0;
    default: return SIZE_MAX;  // gather, scatter, point to point: not on the board
  }
}

}  // namespace

bool BoardRoute::supports(const Collective& c, bool blocking) const {
  const std::size_t max_bytes = options().shm_board_bytes;
  return site().shm && options().check_signatures && small_blocking(c, blocking) && max_bytes > 0 &&
         payload_bytes(c, site().mpi.size) <= std::min(max_bytes, ShmChannel::kBoardPayloadBytes);
}

void BoardRoute::verify(const Collective& c) const { wait_for_peers(*site().shm, c, options().timeout); }

std::shared_ptr<Operation> BoardRoute::run(const Collective& c) {
  ShmChannel& board = *site().shm;
  const std::chrono::milliseconds timeout = options().timeout;
  const int rank = board.rank(), size = board.size();
  const bool publishes = c.kind != K::broadcast || rank == c.root;
  const std::size_t bytes = publishes ? payload_bytes(c, size) : 0;
  const bool root_runs_ahead = c.kind == K::broadcast && rank == c.root;
  publish_signature(board, c, timeout, std::span<const std::byte>(c.input.bytes(), bytes), root_runs_ahead);
  if (root_runs_ahead) {
    // The root needs nothing from its peers: it returns now, as MPI's eager broadcast
    // does, and compares their entries a few calls later (ShmChannel::kRootRunAhead).
    // Until then its `checked` stays behind, so no peer reuses an entry it has not
    // compared.
    if (!c.in_place) std::memcpy(c.output.bytes(), c.input.bytes(), bytes);
    Collective sent = c;
    sent.input = sent.output = Buffer();
    if (board.unverified.capacity() == 0) board.unverified.reserve(ShmChannel::kRootRunAhead);
    board.unverified.push_back(std::move(sent));
    return nullptr;
  }
  // A non-root of a run of broadcasts finds the root's entries written ahead of it:
  // fetching them early makes the cross-core reads overlap (0.20 -> 0.18 us a call
  // when the two cores sit far apart).
  if (c.kind == K::broadcast) __builtin_prefetch(&board.board_entry(c.root, c.sequence + 3));
  verify(c);

  const std::size_t element = element_size(c.dtype);
  const auto entry = [&](int q) -> const std::byte* { return board.board_payload(q, c.sequence); };
  std::byte* out = c.output.bytes();
  switch (c.kind) {
    case K::reduce:
      if (rank != c.root) break;
      [[fallthrough]];
    case K::allreduce:
      // My own data is read back from my entry too: the output may be my input.
      reduce_in_rank_order(c.op, c.dtype, out, out, c.count, size, entry);
      break;
    case K::reduce_scatter: {
      const std::size_t block = static_cast<std::size_t>(rank) * c.count * element;
      reduce_in_rank_order(c.op, c.dtype, out, out, c.count, size, [&](int q) { return entry(q) + block; });
      break;
    }
    case K::allgather:
      for (int q = 0; q < size; ++q) {
        std::byte* to = out + static_cast<std::size_t>(q) * c.count * element;
        if (!(q == rank && c.in_place)) std::memcpy(to, entry(q), c.count * element);
      }
      break;
    case K::broadcast:  // a non-root: the root returned above
      std::memcpy(out, entry(c.root), c.count * element);
      break;
    default: break;  // barrier: the agreement was all of it
  }
  // Only now may the peers reuse their entries: I have read them.
  mark_checked(board, c);
  return nullptr;
}

}  // namespace troupe::collectives::detail
