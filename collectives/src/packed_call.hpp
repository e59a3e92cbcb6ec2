// Small blocking calls with their signature inside the same MPI message, for the
// signature check across nodes (signature_check.hpp), where there is no board to
// read: an all-reduced signature beside the call costs a second round trip, as much
// as the small call itself.
//
// The record each rank contributes is [ header | payload ]: the header holds the
// signature s and -s as int64 fields.
//   allreduce  one record, all-reduced with an MPI_Op of troupe's: the headers by
//              field-wise minimum (so every rank learns min(s) and max(s)), the
//              payloads with the call's op, only where all headers agree;
//   reduce_scatter  one record per rank's block, reduced with the same op and
//              scattered (MPI_Reduce_scatter_block): each rank's record holds the
//              headers' minima, as an allreduce's does;
//   allgather  every rank's record gathered: each rank compares every header;
//   broadcast  the root's record: each rank compares the root's header with its own;
//   barrier    the header alone, all-reduced by minimum.
// A mismatch throws CollectiveMismatch: after an allreduce, reduce_scatter, allgather
// or barrier on every rank, naming the ranks (the signatures are allgathered on the
// check communicator); after a broadcast on the ranks that differ from the root.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>

#include "mpi_request_operation.hpp"
#include "troupe/collectives/collective.hpp"

namespace troupe::collectives::detail {

// Calls of at most this many bytes (the larger buffer) are packed: above it the
// payload's two copies cost more than the all-reduced signature saves.
constexpr std::size_t kPackedCallBytes = 4096;

bool can_pack(const Collective& collective);

// Runs `collective` (can_pack) as one blocking MPI call with its signature packed in.
// Throws CollectiveMismatch on a mismatch.
void run_packed(const Collective& collective, const MpiSite& site, MPI_Comm check_comm,
                std::chrono::milliseconds timeout);

}  // namespace troupe::collectives::detail
