#include "troupe/mpi/environment.hpp"

#include "troupe/mpi/mpi_error.hpp"

namespace troupe::mpi {

namespace {
const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}
}  // namespace

Environment::Environment(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  TROUPE_MPI_CHECK(MPI_Initialized(&initialized));
  TROUPE_MPI_CHECK(MPI_Finalized(&finalized));
  if (finalized) throw MpiError("MPI was already finalized in this process; it cannot be initialised again", 0);
  int provided = 0;
  if (!initialized) {
    TROUPE_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_ = true;
  } else {
    TROUPE_MPI_CHECK(MPI_Query_thread(&provided));
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (owns_) MPI_Finalize();
    owns_ = false;
    throw MpiError(
        detail::concat("troupe needs MPI_THREAD_MULTIPLE, but this MPI provides ", thread_level_name(provided),
                       " (rebuild Open MPI with thread support, or initialise MPI with "
                       "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...))"),
        0);
  }
  TROUPE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  TROUPE_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
}

Environment::~Environment() {
  if (owns_) MPI_Finalize();
}

}  // namespace troupe::mpi
