// The train test binary runs under mpirun with 1, 2 and 4 ranks (see
// tests/train/CMakeLists.txt). Every rank runs the same tests in the same order, as
// collectives require; only rank 0 prints the full report, other ranks their failures.
#include <gtest/gtest.h>

#include "../rank_report.hpp"
#include "train_world.hpp"
#include "troupe/mpi/environment.hpp"

int main(int argc, char** argv) {
  troupe::mpi::Environment mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  troupe::test_support::report_failures_only(mpi.rank());
  const int result = RUN_ALL_TESTS();
  troupe::train::testing::release_world();
  return result;
}
