// job_metrics.hpp: the Prometheus text troupe-run serves, and the phase clock behind it.
#include <gtest/gtest.h>

#include "job_metrics.hpp"

using namespace troupe::supervisor;

namespace {
RankStatus status(int rank, Phase phase, std::optional<std::uint64_t> step) {
  RankStatus r;
  r.rank = rank;
  r.registered = r.connected = true;
  r.progress.phase = phase;
  r.progress.has_step = step.has_value();
  r.progress.step = step.value_or(0);
  return r;
}
}  // namespace

TEST(Metrics, LabelValuesAreEscapedAsTheTextFormatAsks) {
  JobMetrics m;
  m.run_id = "r";
  m.actors.push_back(ActorMetrics{.rank = 2, .actor = "A \"q\" \\ b\nc", .state = "alive", .mailbox_depth = 3});
  const std::string text = prometheus_text(m);
  EXPECT_NE(text.find("troupe_actor_mailbox_depth{rank=\"2\",actor=\"A \\\"q\\\" \\\\ b\\nc\"} 3\n"), std::string::npos)
      << text;
  // Every line is a comment or one sample: name{labels} value.
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    ASSERT_NE(end, std::string::npos) << "the text ends with a newline";
    const std::string line = text.substr(start, end - start);
    EXPECT_TRUE(line.starts_with("# HELP ") || line.starts_with("# TYPE ") ||
                (line.starts_with("troupe_") && line.find(' ') != std::string::npos))
        << line;
    start = end + 1;
  }
}

TEST(Metrics, ThePhaseClockTimesEachPhaseAndEachRanksStepRate) {
  PhaseClock clock;
  const auto t0 = Clock::now();
  using std::chrono::milliseconds;
  clock.on_progress(status(0, Phase::training, 10), t0);
  clock.on_progress(status(0, Phase::training, 20), t0 + milliseconds(1000));
  EXPECT_NEAR(clock.steps_per_second(0), 10.0, 1e-9);
  EXPECT_EQ(clock.steps_per_second(1), 0) << "no reports from rank 1";
  clock.on_progress(status(0, Phase::checkpoint_save, 20), t0 + milliseconds(1500));
  clock.on_progress(status(0, Phase::training, 20), t0 + milliseconds(1750));
  EXPECT_EQ(clock.totals(Phase::checkpoint_save).count, 1u);
  EXPECT_NEAR(clock.totals(Phase::checkpoint_save).last_s, 0.25, 1e-9);
  EXPECT_EQ(clock.totals(Phase::training).count, 1u);
  EXPECT_NEAR(clock.totals(Phase::training).sum_s, 1.5, 1e-9);
  clock.on_progress(status(0, Phase::training, 5), t0 + milliseconds(2000));  // rewound: a relaunch
  EXPECT_EQ(clock.steps_per_second(0), 0) << "a step that went back starts the rate over";
}
