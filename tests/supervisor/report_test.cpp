// The hang report and the run summary: what troupe-run tells a person, from rank
// states and failures built by hand.
#include <gtest/gtest.h>

#include "hang_report.hpp"
#include "run_summary.hpp"

namespace sv = troupe::supervisor;
using namespace std::chrono_literals;

namespace {

sv::RankStatus rank_at(int rank, std::uint64_t step, std::optional<std::uint64_t> sequence,
                       sv::Clock::time_point since) {
  sv::RankStatus r;
  r.rank = rank;
  r.registered = r.connected = true;
  r.progress.has_step = true;
  r.progress.step = step;
  r.progress.has_sequence = sequence.has_value();
  r.progress.sequence = sequence.value_or(0);
  r.progress.phase = sv::Phase::training;
  r.last_progress = since;
  return r;
}

}  // namespace

TEST(HangReport, NamesTheRanksThatNeverEnteredTheCollectiveTheOthersWaitIn) {
  auto now = sv::Clock::now();
  std::vector<sv::RankStatus> ranks = {rank_at(0, 12, 24, now - 2s), rank_at(1, 12, 25, now - 2s),
                                       rank_at(2, 12, 24, now - 2s), rank_at(3, 12, 25, now - 2s)};
  auto report = sv::describe_hang(ranks, now, sv::Seconds(1.5));
  EXPECT_EQ(report.behind, (std::vector<int>{0, 2}));
  EXPECT_NE(report.detail.find("no progress for 1.50 s in training: rank 0 at step 12 in collective 24 (training, "
                               "still for 2.00 s);"),
            std::string::npos)
      << report.detail;
  EXPECT_NE(report.detail.find("behind: rank 0 rank 2 (never entered collective 25)"), std::string::npos)
      << report.detail;
  EXPECT_NE(report.ranks_json.find("{\"rank\": 1, \"step\": 12, \"collective\": 25, \"stalled_s\": 2.0"),
            std::string::npos)
      << report.ranks_json;
}

TEST(HangReport, RanksThatAgreeOrReportNoCollectiveNameNobodyBehind) {
  auto now = sv::Clock::now();
  std::vector<sv::RankStatus> ranks = {rank_at(0, 5, 9, now - 3s), rank_at(1, 5, 9, now - 3s)};
  EXPECT_TRUE(sv::describe_hang(ranks, now, sv::Seconds(3)).behind.empty());
  ranks = {rank_at(0, 5, std::nullopt, now - 3s), rank_at(1, 6, std::nullopt, now)};
  ranks[1].progress.has_step = false;
  auto report = sv::describe_hang(ranks, now, sv::Seconds(3));
  EXPECT_TRUE(report.behind.empty());
  EXPECT_NE(report.detail.find("rank 1 before its first step"), std::string::npos) << report.detail;
  EXPECT_NE(report.ranks_json.find("\"step\": null, \"collective\": null"), std::string::npos) << report.ranks_json;
  EXPECT_EQ(report.detail.back(), ')');
}

TEST(RunSummary, CountsStepsRedoneAndTimeLostPerFailure) {
  sv::RunSummary summary;
  auto t0 = sv::Clock::now();
  summary.failed("rank_lost", "rank 1 died", 17, t0, t0 + 10ms);
  EXPECT_TRUE(summary.resumed(0, t0 + 1s));
  summary.failed("hang", "no progress", 30, t0 + 5s, t0 + 6s);
  EXPECT_EQ(summary.last_cause(), "hang");
  EXPECT_TRUE(summary.resumed(25, t0 + 7s));
  EXPECT_FALSE(summary.resumed(26, t0 + 8s));  // only the first step after a failure counts
  auto totals = summary.close(t0 + 9s);
  EXPECT_DOUBLE_EQ(totals.lost_s, 1.0 + 2.0);
  EXPECT_EQ(totals.steps_redone, 17u + 5u);
  EXPECT_EQ(totals.causes, (std::vector<std::string>{"rank_lost", "hang"}));
  auto text = summary.text("finished", 2, 12.5, 0);
  EXPECT_NE(text.find("summary: finished after 2 failure(s), 2 restart(s), in 12.50 s (exit status 0)"),
            std::string::npos);
  EXPECT_NE(text.find("resumed at step 25 (5 step(s) redone, 2.00 s lost)"), std::string::npos) << text;
  EXPECT_NE(text.find("time lost 3.00 s, steps redone 22"), std::string::npos) << text;
}

TEST(RunSummary, AFailureNeverResumedLosesTimeUntilTheEnd) {
  sv::RunSummary summary;
  auto t0 = sv::Clock::now();
  summary.failed("rank_lost", "rank 1 died", std::nullopt, t0, t0);
  auto totals = summary.close(t0 + 4s);
  EXPECT_DOUBLE_EQ(totals.lost_s, 4.0);
  EXPECT_EQ(totals.steps_redone, 0u);
}

TEST(RunSummary, RelaunchesThatFailBeforeTheirFirstStepAreOneStretchOfDowntime) {
  sv::RunSummary summary;
  auto t0 = sv::Clock::now();
  summary.failed("rank_lost", "rank 1 died", 17, t0, t0 + 1s);
  // The relaunch dies before any step; "last progress" is still t0.
  summary.failed("mpirun_exit", "mpirun exited with status 1", std::nullopt, t0, t0 + 3s);
  EXPECT_TRUE(summary.resumed(15, t0 + 5s));
  auto totals = summary.close(t0 + 6s);
  EXPECT_DOUBLE_EQ(totals.lost_s, 3.0 + 2.0);  // t0..t0+3s, then t0+3s..t0+5s: counted once
}

TEST(RankStatus, TheLongestSilentRankIsFoundAndAStopEndsWhenEveryRankIsGoneOrSilent) {
  auto now = sv::Clock::now();
  std::vector<sv::RankStatus> ranks = {rank_at(0, 5, 9, now), rank_at(1, 5, 9, now), rank_at(2, 5, 9, now)};
  ranks[0].last_heard = now - 100ms;
  ranks[1].last_heard = now - 3s;
  ranks[2].last_heard = now - 2s;
  const sv::RankStatus* silent = sv::longest_silent(ranks, now, 500ms);
  ASSERT_NE(silent, nullptr);
  EXPECT_EQ(silent->rank, 1);
  EXPECT_EQ(sv::longest_silent(ranks, now, 5s), nullptr);
  EXPECT_FALSE(sv::every_rank_gone(ranks, now, 1500ms));  // rank 0 still talks
  ranks[0].connected = false;                             // ... and now it exited
  EXPECT_TRUE(sv::every_rank_gone(ranks, now, 1500ms));
  ranks[2].registered = false;  // a rank that never registered may still be running
  EXPECT_FALSE(sv::every_rank_gone(ranks, now, 1500ms));
}
