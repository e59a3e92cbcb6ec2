#include "troupe/mpi/mpi_error.hpp"

namespace troupe::mpi {

int world_rank_or_unknown() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void check(int code, const char* call, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw MpiError(detail::concat(call, " failed: ", text, " [rank ", world_rank_or_unknown(), "] (",
                                detail::short_path(file), ":", line, ")"),
                 code);
}

}  // namespace troupe::mpi
