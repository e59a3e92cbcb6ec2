// train_sharding_test's main: as main.cpp (every rank runs the same tests in the same
// order; rank 0 prints the report, other ranks their failures), except that the
// failure printer remembers the running test from OnTestStart. Asking gtest for
// current_test_info() inside OnTestPartResult takes the UnitTest mutex that
// AddTestPartResult already holds: a failing expectation on a rank other than 0 then
// deadlocks that rank, and the others time out in their next collective.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "train_world.hpp"
#include "troupe/mpi/environment.hpp"

namespace {
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s failed at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
  }

 private:
  int rank_;
  std::string test_ = "?";
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
