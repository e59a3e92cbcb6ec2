// The collectives test binary runs under mpirun with 1 to 4 ranks (see
// tests/CMakeLists.txt): MPI lives for the whole run, and every rank runs the same
// tests in the same order, as collectives require.
#include <gtest/gtest.h>

#include <cstdio>

#include "test_world.hpp"
#include "troupe/mpi/environment.hpp"

namespace {
// On ranks other than 0, only failures are printed, tagged with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "[rank %d] %s.%s failed at %s:%d\n%s\n", rank_, test ? test->test_suite_name() : "?",
                 test ? test->name() : "?", result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  troupe::mpi::Environment mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.rank() != 0) {
    // One rank's report is enough when all agree; failures still print on every rank.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(mpi.rank()));
  }
  const int result = RUN_ALL_TESTS();
  troupe::collectives::testing::release_world();
  // Any failing rank fails the job: mpirun reports the first non-zero exit.
  return result;
}
