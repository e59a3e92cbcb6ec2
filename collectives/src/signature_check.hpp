// Debug mode's cross-rank check (TROUPE_DEBUG_COLLECTIVES=1, PyTorch's
// TORCH_DISTRIBUTED_DEBUG=DETAIL in spirit): before a collective starts, every rank
// contributes its (sequence, kind, count, dtype, op, root) to an allgather on a
// communicator of its own; if they differ, every rank throws CollectiveMismatch with
// the same message, listing which ranks issued which call, and nothing is sent.
#pragma once

#include <mpi.h>

#include <chrono>

#include "troupe/collectives/collective.hpp"

namespace troupe::collectives::detail {

// Throws CollectiveMismatch on a mismatch, TimeoutError if not every rank arrives in time.
void verify_signature(MPI_Comm comm, const Collective& collective, int rank, int size,
                      std::chrono::milliseconds timeout);

}  // namespace troupe::collectives::detail
