// The errors collectives add to troupe's tree (core/include/troupe/error.hpp):
//
//   TimeoutError (troupe's own): a wait ran past its timeout. The message names the
//     collective, its sequence number, its size and, when known, the peer not heard from.
//   CollectiveMismatch: ranks issued different calls at the same sequence number
//     (another op, count, dtype or root, or a skipped call), found by the signature
//     check every call carries; the message lists every rank's call.
//   CommunicatorFailed: an earlier collective timed out or failed, so this communicator
//     refuses new work instead of hanging on a peer that may never come (gloo's rule).
//   NcclError: NCCL or CUDA reported an error; the message carries its own string.
//
// MpiError (troupe/mpi/mpi_error.hpp) reports a failed MPI call.
#pragma once

#include "troupe/error.hpp"

namespace troupe::collectives {

class CollectiveMismatch : public Error {
 public:
  using Error::Error;
};

class CommunicatorFailed : public Error {
 public:
  using Error::Error;
};

class NcclError : public Error {
 public:
  using Error::Error;
};

}  // namespace troupe::collectives
