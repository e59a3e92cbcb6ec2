// Every MPI call in troupe goes through TROUPE_MPI_CHECK, so a failure names the
// call, MPI's own error string, the rank and file:line instead of a bare code.
#pragma once

#include <mpi.h>

#include "troupe/error.hpp"

namespace troupe::mpi {

class MpiError : public Error {
 public:
  MpiError(const std::string& message, int code) : Error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// Rank in MPI_COMM_WORLD, or -1 before MPI_Init / after MPI_Finalize.
int world_rank_or_unknown();

// Throws MpiError for a code other than MPI_SUCCESS.
void check(int code, const char* call, const char* file, int line);

}  // namespace troupe::mpi

#define TROUPE_MPI_CHECK(call) ::troupe::mpi::check((call), #call, __FILE__, __LINE__)
