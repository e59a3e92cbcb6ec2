// The train test binary runs under mpirun with 1, 2 and 4 ranks (see
// tests/train/CMakeLists.txt). Every rank runs the same tests in the same order, as
// collectives require; only rank 0 prints the full report, other ranks their failures.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "train_world.hpp"
#include "troupe/mpi/environment.hpp"

namespace {
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // The test's name is remembered here: OnTestPartResult runs under gtest's own lock,
  // so calling UnitTest::current_test_info() from it deadlocks.
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
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
