#include <cstdio>

#include "actors_fixture.hpp"

namespace troupe::test {
namespace {
Runtime* g_runtime = nullptr;

// Ranks other than 0 print only failures, each prefixed with its rank, so the log
// stays readable and a failure on any rank is still visible.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::printf("[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                  r.summary());
  }

 private:
  int rank_;
};
}  // namespace

Runtime& runtime() { return *g_runtime; }
}  // namespace troupe::test

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  troupe::Runtime rt(argc, argv);
  troupe::test::g_runtime = &rt;
  if (rt.rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new troupe::test::RankFailurePrinter(rt.rank()));
  }
  const int failed = RUN_ALL_TESTS();
  rt.shutdown();
  return failed;
}
