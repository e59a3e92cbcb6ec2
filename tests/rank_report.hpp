// Under mpirun every rank runs the same GoogleTest binary. One full report is enough:
// after InitGoogleTest, report_failures_only(rank) makes ranks other than 0 print only
// their failures, each tagged with the rank and the test, so the log stays readable
// and a failure on any rank is still seen.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace troupe::test_support {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test's name is remembered here: OnTestPartResult runs under gtest's own lock,
  // so calling UnitTest::current_test_info() from it deadlocks that rank.
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

inline void report_failures_only(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace troupe::test_support
