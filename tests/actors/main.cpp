#include <atomic>
#include <cstdio>
#include <string>

#include "../rank_report.hpp"
#include "actors_fixture.hpp"

namespace troupe::test {
namespace {
Runtime* g_runtime = nullptr;
int g_pool_threads = 1;
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
  options.attachment_timeout = std::chrono::seconds(3);  // bytes_test drops a message after it
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--threads") options.threads = std::stoi(argv[i + 1]);
    // --object-store-limit BYTES: object_ref_test then checks the refusal.
    if (std::string(argv[i]) == "--object-store-limit") options.object_store_limit = std::stoull(argv[i + 1]);
  }
  troupe::Runtime rt(argc, argv, options);
  troupe::test::g_runtime = &rt;
  troupe::test::g_pool_threads = options.threads;
  troupe::test_support::report_failures_only(rt.rank());
  const int failed = RUN_ALL_TESTS();
  const bool drained = troupe::test::shutdown_drains_messages_in_flight(rt);
  return failed || !drained ? 1 : 0;
}
