#include <atomic>
#include <cstdio>
#include <string>

#include "actors_fixture.hpp"

namespace troupe::test {
namespace {
Runtime* g_runtime = nullptr;
int g_pool_threads = 1;

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
int pool_threads() { return g_pool_threads; }

namespace {
// Counts tells handled on this rank; checked after shutdown, when the actors are gone.
std::atomic<int> g_tallied{0};
struct Tally {
  void add(int n) { g_tallied += n; }
  static constexpr auto troupe_methods = troupe::methods<&Tally::add>;
};
}  // namespace

// Sends tells to every rank right before the collective shutdown: shutdown must
// drain them, not drop them. Returns whether this rank handled all it was sent.
bool shutdown_drains_messages_in_flight(Runtime& rt) {
  constexpr int kTells = 2000;
  auto tallies = rt.spawn_on_each<Tally>();
  for (const auto& t : tallies)
    for (int i = 0; i < kTells; ++i) t.tell(&Tally::add, 1);
  rt.shutdown();
  const int expected = kTells * rt.size();
  if (g_tallied.load() == expected) return true;
  std::printf("[rank %d] shutdown dropped messages: handled %d tells of %d\n", rt.rank(), g_tallied.load(), expected);
  return false;
}
}  // namespace troupe::test

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  // --threads N: the same tests with RuntimeOptions::threads = N (0: no pool threads,
  // methods run on the progress thread).
  troupe::RuntimeOptions options;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--threads") options.threads = std::stoi(argv[i + 1]);
  }
  troupe::Runtime rt(argc, argv, options);
  troupe::test::g_runtime = &rt;
  troupe::test::g_pool_threads = options.threads;
  if (rt.rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new troupe::test::RankFailurePrinter(rt.rank()));
  }
  const int failed = RUN_ALL_TESTS();
  const bool drained = troupe::test::shutdown_drains_messages_in_flight(rt);
  return failed || !drained ? 1 : 0;
}
