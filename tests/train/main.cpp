// The train test binary runs under mpirun with 1, 2 and 4 ranks (see
// tests/train/CMakeLists.txt). Every rank runs the same tests in the same order, as
// collectives require; only rank 0 prints the full report, other ranks their failures.
#include <gtest/gtest.h>

#include <cstdio>

#include "train_world.hpp"
#include "troupe/mpi/environment.hpp"

namespace {
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
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(mpi.rank()));
  }
  const int result = RUN_ALL_TESTS();
  troupe::train::testing::release_world();
  return result;
}
