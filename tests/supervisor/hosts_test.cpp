// The job's hosts (job_hosts.hpp), the pool that leaves failing ones out (host_pool.hpp),
// and the room a relaunch needs in the checkpoint folder (host_probe.hpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "../small_disk.hpp"
#include "host_pool.hpp"
#include "host_probe.hpp"
#include "job_hosts.hpp"
#include "mpirun_command.hpp"
#include "straggler_watch.hpp"
#include "troupe/error.hpp"

namespace sv = troupe::supervisor;

namespace {

sv::RunOptions with_args(std::vector<std::string> args) {
  sv::RunOptions o;
  o.np = 3;
  o.mpirun_args = std::move(args);
  return o;
}

const char* no_env(const char*) { return nullptr; }

std::string write_file(const std::string& text) {
  std::string path = ::testing::TempDir() + "/hostfile-" + std::to_string(std::rand());
  std::ofstream(path) << text;
  return path;
}

sv::JobHosts three_nodes() { return {{{"node1", 1}, {"node2", 1}, {"node3", 1}}, "--hostfile h"}; }

}  // namespace

TEST(JobHosts, AHostfileGivesNamesAndSlotsAndSkipsComments) {
  auto path = write_file("# the cluster\nnode1 slots=2\n\n  node2 slots=1 max_slots=4 # spare\nnode3\n");
  auto hosts = sv::job_hosts(with_args({"--hostfile", path}), no_env);
  ASSERT_EQ(hosts.hosts.size(), 3u);
  EXPECT_EQ(hosts.hosts[0].name, "node1");
  EXPECT_EQ(hosts.hosts[0].slots, 2);
  EXPECT_EQ(hosts.hosts[1].slots, 1);
  EXPECT_EQ(hosts.hosts[2].slots, 0);
  EXPECT_EQ(hosts.source, "--hostfile " + path);
}

TEST(JobHosts, AMalformedOrMissingHostfileIsNamedWithItsLine) {
  auto bad = write_file("node1 slots=two\n");
  try {
    sv::job_hosts(with_args({"--hostfile", bad}), no_env);
    FAIL() << "no error";
  } catch (const troupe::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":1: slots 'two'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sv::job_hosts(with_args({"--hostfile", "/nonexistent/hosts"}), no_env), troupe::InvalidArgument);
  EXPECT_THROW(sv::job_hosts(with_args({"--hostfile", write_file("# nothing\n")}), no_env), troupe::InvalidArgument);
}

TEST(JobHosts, AHostListAndASlurmAllocationAreRead) {
  auto listed = sv::job_hosts(with_args({"--host", "a,b:2,c"}), no_env);
  ASSERT_EQ(listed.hosts.size(), 3u);
  EXPECT_EQ(listed.hosts[1].name, "b");
  EXPECT_EQ(listed.hosts[1].slots, 2);
  auto slurm = sv::job_hosts(with_args({}), [](const char* name) -> const char* {
    return std::string(name) == "SLURM_JOB_NODELIST" ? "node[1-3]" : nullptr;
  });
  ASSERT_EQ(slurm.hosts.size(), 3u);
  EXPECT_EQ(slurm.hosts[2].name, "node3");
  EXPECT_EQ(slurm.source, "the Slurm allocation");
  EXPECT_TRUE(sv::job_hosts(with_args({"--oversubscribe"}), no_env).hosts.empty());
}

TEST(JobHosts, SlurmHostListsExpandAsScontrolDoes) {
  EXPECT_EQ(sv::expand_hostlist("node[1-3,07],login"),
            (std::vector<std::string>{"node1", "node2", "node3", "node07", "login"}));
  EXPECT_EQ(sv::expand_hostlist("gpu[01-02]-ib,cpu5"), (std::vector<std::string>{"gpu01-ib", "gpu02-ib", "cpu5"}));
  EXPECT_EQ(sv::expand_hostlist("solo"), (std::vector<std::string>{"solo"}));
  EXPECT_THROW(sv::expand_hostlist("node[1-3"), troupe::InvalidArgument);
  EXPECT_THROW(sv::expand_hostlist("node[3-1]"), troupe::InvalidArgument);
}

TEST(JobHosts, LoopbackNamesAreThisHostAndAnUnknownHostIsAnError) {
  EXPECT_TRUE(sv::is_this_host("localhost"));
  EXPECT_TRUE(sv::is_this_host("127.0.0.1"));
  EXPECT_EQ(sv::route_source_address("127.0.0.1"), "127.0.0.1");
  try {
    sv::route_source_address("no-such-host.invalid");
    FAIL() << "no error";
  } catch (const troupe::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'no-such-host.invalid' does not resolve"), std::string::npos) << e.what();
  }
}

TEST(HostPool, AHostIsLeftOutAfterKFailuresAndTheJobShrinksToTheRest) {
  sv::HostPool pool(three_nodes(), 3, /*exclude_after=*/2, /*min_ranks=*/2);
  for (int r = 0; r < 3; ++r) pool.rank_registered(r, "node" + std::to_string(r + 1));
  EXPECT_EQ(pool.blame("node3"), "node3");
  auto first = pool.plan_next_launch();
  EXPECT_TRUE(first.excluded_now.empty());
  EXPECT_EQ(first.np, 3);
  pool.begin_launch();
  // The relaunch fails before any rank registers: blamed on node3 again.
  EXPECT_EQ(pool.blame(""), "node3");
  auto second = pool.plan_next_launch();
  EXPECT_EQ(second.excluded_now, std::vector<std::string>{"node3"});
  EXPECT_EQ(second.np, 2);
  EXPECT_EQ(second.refusal, "");
  auto left = pool.remaining();
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[1].name, "node2");
}

TEST(HostPool, ASpareHostKeepsTheRankCountAndMinRanksRefusesTooSmallAJob) {
  sv::HostPool spare({{{"a", 1}, {"b", 1}, {"c", 1}}, "--host"}, 2, 1, 0);
  spare.rank_registered(0, "a");
  spare.rank_registered(1, "b");
  spare.blame("b");
  auto plan = spare.plan_next_launch();
  EXPECT_EQ(plan.np, 2);                       // a and c hold two slots
  sv::HostPool tight(three_nodes(), 3, 1, 0);  // min_ranks 0: -np, no shrink
  for (int r = 0; r < 3; ++r) tight.rank_registered(r, "node" + std::to_string(r + 1));
  tight.blame("node2");
  auto refused = tight.plan_next_launch();
  EXPECT_NE(refused.refusal.find("below --min-ranks 3"), std::string::npos) << refused.refusal;
  sv::HostPool never(three_nodes(), 3, 0, 0);  // exclude_after 0: never
  never.blame("node1");
  never.blame("node1");
  EXPECT_TRUE(never.plan_next_launch().excluded_now.empty());
}

TEST(HostPool, TheNextLaunchGetsAHostfileOfTheRemainingHostsInPlaceOfTheUsers) {
  sv::RunOptions options = with_args({"--hostfile", "/user/hosts", "--map-by", "node", "--host", "x"});
  sv::HostPool pool(three_nodes(), 3, 1, 2);
  for (int r = 0; r < 3; ++r) pool.rank_registered(r, "node" + std::to_string(r + 1));
  std::string path = ::testing::TempDir() + "/troupe-run-hosts-test";
  EXPECT_EQ(sv::launch_options(options, pool, path).mpirun_args, options.mpirun_args);  // nothing left out yet
  pool.blame("node2");
  ASSERT_EQ(pool.plan_next_launch().np, 2);
  auto launch = sv::launch_options(options, pool, path);
  EXPECT_EQ(launch.np, 2);
  EXPECT_EQ(launch.mpirun_args, (std::vector<std::string>{"--map-by", "node", "--hostfile", path}));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("node1 slots=1\nnode3 slots=1\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("node2"), std::string::npos) << text;
}

TEST(HostPool, AReturningHostIsReadmittedWithACleanRecordAndTheJobGrowsBack) {
  sv::HostPool pool(three_nodes(), 3, /*exclude_after=*/1, /*min_ranks=*/2);
  for (int r = 0; r < 3; ++r) pool.rank_registered(r, "node" + std::to_string(r + 1));
  pool.blame("node3");
  ASSERT_EQ(pool.plan_next_launch().np, 2);
  EXPECT_EQ(pool.excluded(), std::vector<std::string>{"node3"});
  EXPECT_TRUE(pool.hosts_changed());
  EXPECT_EQ(pool.readmit("node3"), 3);
  EXPECT_TRUE(pool.excluded().empty());
  EXPECT_FALSE(pool.hosts_changed());  // the user's own host options again
  EXPECT_EQ(pool.failures_of("node3"), 0);
  EXPECT_EQ(pool.np(), 3);
  EXPECT_EQ(pool.plan_next_launch().np, 3);  // one old failure does not exclude it again
  EXPECT_EQ(pool.readmit("node9"), 3);       // a host never left out: nothing changes
}

TEST(MpirunCommand, TheProbeStartsOneTrueOnTheHostThroughTheJobsLauncherOptions) {
  auto options = with_args(
      {"--hostfile", "/h", "--mca", "plm_rsh_agent", "/x/rsh", "--map-by", "node", "--bind-to", "none", "-x", "FOO"});
  EXPECT_EQ(sv::probe_command(options, "/usr/bin/mpirun", "node3"),
            (std::vector<std::string>{"/usr/bin/mpirun", "--host", "node3:1", "-np", "1", "--mca", "plm_rsh_agent",
                                      "/x/rsh", "--bind-to", "none", "-x", "FOO", "true"}));
}

namespace {
// Ranks whose heartbeats report `work_ms` of their own work per step, `steps` more steps.
void advance(std::vector<sv::RankStatus>& ranks, const std::vector<double>& work_ms, std::uint64_t steps) {
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].progress.work_steps += steps;
    ranks[r].progress.work_us += static_cast<std::uint64_t>(work_ms[r] * 1000 * static_cast<double>(steps));
    ranks[r].progress.step += steps;
  }
}
}  // namespace

TEST(StragglerWatch, ARankThatWorksLongerPerStepTwiceInARowIsNamedOnceAndClearedAfter) {
  std::vector<sv::RankStatus> ranks(3);
  for (int r = 0; r < 3; ++r) {
    ranks[static_cast<std::size_t>(r)].rank = r;
    ranks[static_cast<std::size_t>(r)].registered = ranks[static_cast<std::size_t>(r)].connected = true;
    ranks[static_cast<std::size_t>(r)].host = "node" + std::to_string(r + 1);
  }
  sv::StragglerWatch watch(1.5, std::chrono::seconds(1), 3);
  watch.begin_launch(3);
  auto t = sv::Clock::time_point{} + std::chrono::hours(1);
  EXPECT_TRUE(watch.update(ranks, t).empty());  // the first look only starts the windows
  const std::vector<double> slow_third = {10, 11, 40};
  advance(ranks, slow_third, 2);
  EXPECT_TRUE(watch.update(ranks, t += std::chrono::seconds(2)).empty()) << "2 steps are too few for a window";
  advance(ranks, slow_third, 20);
  EXPECT_TRUE(watch.update(ranks, t += std::chrono::milliseconds(500)).empty()) << "one window above is not enough";
  EXPECT_TRUE(watch.update(ranks, t += std::chrono::seconds(1)).empty()) << "no steps, no window";
  advance(ranks, slow_third, 30);
  auto changes = watch.update(ranks, t += std::chrono::seconds(1));
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_TRUE(changes[0].straggling);
  EXPECT_EQ(changes[0].rank, 2);
  EXPECT_EQ(changes[0].host, "node3");
  EXPECT_NEAR(changes[0].work_ms, 40, 0.01);
  EXPECT_NEAR(changes[0].median_ms, 11, 0.01);  // the median of 10, 11, 40
  EXPECT_NEAR(changes[0].slower, 40.0 / 11, 0.01);
  EXPECT_TRUE(watch.straggling(2));
  advance(ranks, slow_third, 30);
  EXPECT_TRUE(watch.update(ranks, t += std::chrono::seconds(1)).empty()) << "reported once, not every window";
  const std::vector<double> even = {10, 11, 12};
  for (int window = 0; window < 2; ++window) {
    advance(ranks, even, 30);
    changes = watch.update(ranks, t += std::chrono::seconds(1));
  }
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_FALSE(changes[0].straggling);
  EXPECT_FALSE(watch.straggling(2));
  sv::StragglerWatch off(0);
  off.begin_launch(3);
  EXPECT_TRUE(off.update(ranks, t).empty());
}

TEST(RunOptions, RegrowNeedsACheckpointDirAndExclusionAndStragglerRatioIsChecked) {
  auto parse = [](std::vector<std::string> args) { return sv::parse_run_options(args); };
  auto o = parse({"-np", "3", "--checkpoint-dir", "/tmp/c", "--exclude-after", "2", "--regrow", "--probe-interval",
                  "2.5", "--straggler-ratio", "2", "--", "x"});
  EXPECT_TRUE(o.regrow);
  EXPECT_DOUBLE_EQ(o.probe_interval.count(), 2.5);
  EXPECT_DOUBLE_EQ(o.straggler_ratio, 2);
  EXPECT_DOUBLE_EQ(parse({"-np", "3", "--", "x"}).straggler_ratio, 1.5);
  auto message = [&](std::vector<std::string> args) {
    try {
      parse(args);
    } catch (const troupe::InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message({"-np", "3", "--exclude-after", "1", "--regrow", "--", "x"}).find("--regrow needs --checkpoint-dir"),
      std::string::npos);
  EXPECT_NE(
      message({"-np", "3", "--checkpoint-dir", "/tmp/c", "--regrow", "--", "x"}).find("--regrow needs --exclude-after"),
      std::string::npos);
  EXPECT_NE(message({"-np", "3", "--straggler-ratio", "0.5", "--", "x"}).find("expected a ratio above 1"),
            std::string::npos);
}

// A relaunch needs room for another checkpoint as large as the newest. What the dead job
// left half done (a killed save's temporary file, an old checkpoint it was deleting) is
// room: the relaunch's first save deletes it before it checks. Anything else is not.
TEST(CheckpointRoom, WhatTheDeadJobLeftHalfDoneCountsAsRoomForTheRelaunch) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("troupe-room-" + std::to_string(::getpid()));
  {
    troupe::test_support::SmallDisk disk(dir, 512 << 10);
    if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN)";
    const auto write = [&](const std::string& name, std::uintmax_t bytes) {
      std::ofstream(dir / name, std::ios::binary) << std::string(static_cast<std::size_t>(bytes), 'x');
    };
    write("ckpt-000000002.h5", 128 << 10);
    EXPECT_EQ(sv::checkpoint_space_shortfall(dir.string()), "");
    for (const char* left : {".ckpt-000000003.h5.tmp-node1-41", ".ckpt-000000001.h5.going-node1-41"}) {
      write(left, fs::space(dir).available - (8 << 10));
      ASSERT_LT(fs::space(dir).available, 128u << 10);
      EXPECT_EQ(sv::checkpoint_space_shortfall(dir.string()), "") << left;
      fs::rename(dir / left, dir / "notes.txt");  // the same bytes, but not the job's
      const std::string full = sv::checkpoint_space_shortfall(dir.string());
      EXPECT_NE(full.find("its newest checkpoint (ckpt-000000002.h5) took 131072"), std::string::npos) << full;
      fs::remove(dir / "notes.txt");
    }
  }
  fs::remove_all(dir);
}
