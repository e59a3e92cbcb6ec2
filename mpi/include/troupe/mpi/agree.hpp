// all_agree: whether every rank of a communicator says yes -- the step before using a
// resource each rank set up on its own (a shared-memory segment, say), so that all of
// them take the same path. Collective over `comm`.
#pragma once

#include <mpi.h>

#include "troupe/mpi/mpi_error.hpp"

namespace troupe::mpi {

inline bool all_agree(MPI_Comm comm, bool mine) {
  int all = mine ? 1 : 0;
  TROUPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, comm));
  return all == 1;
}

}  // namespace troupe::mpi
