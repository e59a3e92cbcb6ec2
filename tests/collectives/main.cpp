// The collectives test binary runs under mpirun with 1 to 4 ranks (see
// tests/CMakeLists.txt): MPI lives for the whole run, and every rank runs the same
// tests in the same order, as collectives require.
#include <gtest/gtest.h>

#include "../rank_report.hpp"
#include "test_world.hpp"
#include "troupe/mpi/environment.hpp"

int main(int argc, char** argv) {
  troupe::mpi::Environment mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  troupe::test_support::report_failures_only(mpi.rank());
  const int result = RUN_ALL_TESTS();
  troupe::collectives::testing::release_world();
  // Any failing rank fails the job: mpirun reports the first non-zero exit.
  return result;
}
