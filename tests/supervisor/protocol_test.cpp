// Pure functions of the supervisor module: the wire format, troupe-run's command line,
// TROUPE_FAULT, the mpirun command, the launch environment and JSON quoting.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "event_log.hpp"
#include "mpirun_command.hpp"
#include "run_options.hpp"
#include "troupe/error.hpp"
#include "troupe/supervisor/fault.hpp"
#include "troupe/supervisor/protocol.hpp"
#include "troupe/supervisor/run_environment.hpp"

namespace sv = troupe::supervisor;

namespace {

sv::Message round_trip(const sv::Message& m) {
  auto frame = sv::encode(m);
  EXPECT_GE(frame.size(), sv::kFrameHeader + 1);
  std::uint32_t n = sv::decode_length(frame.data());
  EXPECT_EQ(n, frame.size() - sv::kFrameHeader);
  return sv::decode_payload(frame.data() + sv::kFrameHeader, n);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const troupe::Error& e) {
    return e.what();
  }
  return "(no error)";
}

sv::RunOptions parse(std::vector<std::string> args) { return sv::parse_run_options(args); }

}  // namespace

TEST(Protocol, HelloAndHeartbeatSurviveARoundTrip) {
  sv::Hello hello{"0123456789abcdef", "run-1", 2, 3, 4, 4242, "node-7"};
  auto back = std::get<sv::Hello>(round_trip(hello));
  EXPECT_EQ(back.token, hello.token);
  EXPECT_EQ(back.run_id, "run-1");
  EXPECT_EQ(back.restart, 2u);
  EXPECT_EQ(back.rank, 3u);
  EXPECT_EQ(back.world_size, 4u);
  EXPECT_EQ(back.pid, 4242u);
  EXPECT_EQ(back.host, "node-7");

  sv::Heartbeat beat{(1ull << 40) + 7, 99, true, false, sv::Phase::checkpoint_save, (1ull << 35) + 3, 1234};
  auto b = std::get<sv::Heartbeat>(round_trip(beat));
  EXPECT_EQ(b.work_us, beat.work_us);
  EXPECT_EQ(b.work_steps, 1234u);
  EXPECT_EQ(b.step, beat.step);
  EXPECT_EQ(b.sequence, 99u);
  EXPECT_TRUE(b.has_step);
  EXPECT_FALSE(b.has_sequence);
  EXPECT_EQ(b.phase, sv::Phase::checkpoint_save);
  EXPECT_EQ(std::get<sv::Refused>(round_trip(sv::Refused{"wrong token"})).reason, "wrong token");
  EXPECT_TRUE(std::holds_alternative<sv::Goodbye>(round_trip(sv::Goodbye{})));
  EXPECT_TRUE(std::holds_alternative<sv::Alive>(round_trip(sv::Alive{})));
}

TEST(Protocol, PhasesHaveNamesAndAnUnknownOneIsRefused) {
  for (int i = 0; i < sv::kPhases; ++i)
    EXPECT_EQ(sv::parse_phase(sv::phase_name(static_cast<sv::Phase>(i))), static_cast<sv::Phase>(i));
  EXPECT_NE(error_of([] { sv::parse_phase("saving"); }).find("unknown phase 'saving' (phases: startup, training"),
            std::string::npos);
  // A heartbeat whose phase byte is out of range is a format error, not a crash.
  auto frame = sv::encode(sv::Heartbeat{});
  frame[sv::kFrameHeader + 1 + 8 + 8 + 1] = 77;  // kind, step, sequence, flags, then the phase
  EXPECT_NE(error_of([&] {
              sv::decode_payload(frame.data() + sv::kFrameHeader, frame.size() - sv::kFrameHeader);
            }).find("heartbeat phase 77"),
            std::string::npos);
}

TEST(RunOptions, EachPhaseHasADeadlineAndTrainingTakesTheHangTimeout) {
  auto o = parse({"-np", "2", "--hang-timeout", "30", "--phase-timeout", "checkpoint_save=7200", "--", "x"});
  EXPECT_DOUBLE_EQ(sv::phase_timeout(o, sv::Phase::training).count(), 30);
  EXPECT_DOUBLE_EQ(sv::phase_timeout(o, sv::Phase::checkpoint_save).count(), 7200);
  EXPECT_DOUBLE_EQ(sv::phase_timeout(o, sv::Phase::evaluation).count(), 1800);
  EXPECT_DOUBLE_EQ(sv::phase_timeout(o, sv::Phase::startup).count(), 600);
  auto slow = parse({"-np", "2", "--hang-timeout", "5000", "--", "x"});  // never below the hang timeout
  EXPECT_DOUBLE_EQ(sv::phase_timeout(slow, sv::Phase::checkpoint_load).count(), 5000);
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--phase-timeout", "saving=3", "--", "x"});
            }).find("unknown phase 'saving'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--phase-timeout", "evaluation", "--", "x"});
            }).find("PHASE=SECONDS"),
            std::string::npos);
}

TEST(Protocol, AHugeOrEmptyLengthPrefixIsRefusedBeforeAnyAllocation) {
  std::uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
  EXPECT_NE(error_of([&] { sv::decode_length(huge); }).find("length prefix 4294967295 exceeds"), std::string::npos);
  std::uint8_t zero[4] = {0, 0, 0, 0};
  EXPECT_THROW(sv::decode_length(zero), troupe::FormatError);
  std::uint8_t limit[4] = {static_cast<std::uint8_t>(sv::kMaxPayload & 0xff),
                           static_cast<std::uint8_t>(sv::kMaxPayload >> 8), 0, 0};
  EXPECT_EQ(sv::decode_length(limit), sv::kMaxPayload);
}

TEST(Protocol, TruncatedUnknownOrPaddedPayloadsAreFormatErrors) {
  auto frame = sv::encode(sv::Hello{"t", "r", 0, 0, 1, 1, "h"});
  const std::uint8_t* payload = frame.data() + sv::kFrameHeader;
  std::size_t n = frame.size() - sv::kFrameHeader;
  for (std::size_t cut = 0; cut < n; ++cut)
    EXPECT_THROW(sv::decode_payload(payload, cut), troupe::FormatError) << "cut at " << cut;
  std::vector<std::uint8_t> padded(payload, payload + n);
  padded.push_back(0);
  EXPECT_NE(error_of([&] { sv::decode_payload(padded.data(), padded.size()); }).find("1 unexpected bytes"),
            std::string::npos);
  std::uint8_t unknown[] = {77};
  EXPECT_NE(error_of([&] { sv::decode_payload(unknown, 1); }).find("unknown message kind 77"), std::string::npos);
  std::uint8_t bad_flags[] = {4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9};
  EXPECT_THROW(sv::decode_payload(bad_flags, sizeof bad_flags), troupe::FormatError);
  std::uint8_t old_version[] = {1, 9, 0};
  EXPECT_NE(error_of([&] { sv::decode_payload(old_version, 3); }).find("version 9"), std::string::npos);
}

TEST(RunOptions, ParsesOwnFlagsPassesMpirunOptionsAndKeepsTheProgram) {
  auto o = parse({"-np",
                  "4",
                  "--max-restarts",
                  "5",
                  "--checkpoint-dir",
                  "ck",
                  "--hang-timeout",
                  "1.5",
                  "--heartbeat-timeout",
                  "2",
                  "--backoff",
                  "0",
                  "--grace",
                  "0.5",
                  "--bind",
                  "0.0.0.0:7000",
                  "--events",
                  "ev.jsonl",
                  "--hostfile",
                  "hosts",
                  "--mca",
                  "btl",
                  "self,tcp",
                  "--oversubscribe",
                  "--",
                  "./train",
                  "--epochs",
                  "3",
                  "--max-restarts"});
  EXPECT_EQ(o.np, 4);
  EXPECT_EQ(o.max_restarts, 5);
  EXPECT_EQ(o.checkpoint_dir, "ck");
  EXPECT_DOUBLE_EQ(o.hang_timeout.count(), 1.5);
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout.count(), 2);
  EXPECT_DOUBLE_EQ(o.backoff.count(), 0);
  EXPECT_DOUBLE_EQ(o.grace.count(), 0.5);
  EXPECT_EQ(o.bind_host, "0.0.0.0");
  EXPECT_EQ(o.bind_port, 7000);
  EXPECT_EQ(o.events_file, "ev.jsonl");
  EXPECT_EQ(o.mpirun_args,
            (std::vector<std::string>{"--hostfile", "hosts", "--mca", "btl", "self,tcp", "--oversubscribe"}));
  EXPECT_EQ(o.program, (std::vector<std::string>{"./train", "--epochs", "3", "--max-restarts"}));
}

TEST(RunOptions, ClusterFlagsAndTheirDefaults) {
  auto d = parse({"-np", "3", "--", "x"});
  EXPECT_EQ(d.bind_host, "");  // chosen from the job's hosts
  EXPECT_DOUBLE_EQ(d.heartbeat_timeout.count(), 1.5);
  EXPECT_DOUBLE_EQ(d.liveness_timeout.count(), 0);  // the program's own
  EXPECT_DOUBLE_EQ(parse({"-np", "3", "--liveness-timeout", "7.5", "--", "x"}).liveness_timeout.count(), 7.5);
  EXPECT_NE(error_of([] {
              parse({"-np", "3", "--liveness-timeout", "0", "--", "x"});
            }).find("--liveness-timeout"),
            std::string::npos);
  EXPECT_EQ(d.exclude_after, 0);
  EXPECT_EQ(d.min_ranks, 0);
  auto o = parse({"-np", "3", "--exclude-after", "2", "--min-ranks", "2", "--advertise", "10.0.0.1", "--", "x"});
  EXPECT_EQ(o.exclude_after, 2);
  EXPECT_EQ(o.min_ranks, 2);
  EXPECT_EQ(o.advertise, "10.0.0.1");
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--min-ranks", "3", "--", "x"});
            }).find("--min-ranks 3 is above -np 2"),
            std::string::npos);
}

TEST(RunOptions, BadFlagsAreNamedInTheError) {
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--frobnicate", "--", "x"});
            }).find("unknown option '--frobnicate'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse({"-np", "zero", "--", "x"}); }).find("-np 'zero'"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"-np", "0", "--", "x"}); }).find(">= 1"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"--", "x"}); }).find("-np N is required"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"-np", "2"}); }).find("no program given"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"-np", "2", "--"}); }).find("no program given"), std::string::npos);
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--hang-timeout", "-1", "--", "x"});
            }).find("--hang-timeout '-1'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--backoff", "1s", "--", "x"});
            }).find("--backoff '1s'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--bind", "localhost", "--", "x"});
            }).find("ADDR:PORT"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--bind", "1.2.3.4:70000", "--", "x"});
            }).find("above 65535"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--mca", "btl", "--", "x"});
            }).find("--mca needs a value"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse({"-np", "2", "./train"}); }).find("after '--'"), std::string::npos);
  EXPECT_TRUE(parse({"--help"}).help);
}

TEST(MpirunCommand, ExportsByNameAndOversubscribesOnlyWhenNeeded) {
  auto o = parse({"-np", "4", "--mca", "btl", "self,tcp", "--", "./t", "a"});
  auto cmd = sv::mpirun_command(o, "/usr/bin/mpirun", {"TROUPE_SUPERVISOR", "TROUPE_RUN_TOKEN"}, 2);
  EXPECT_EQ(cmd, (std::vector<std::string>{"/usr/bin/mpirun", "-np", "4", "--oversubscribe", "--mca", "btl", "self,tcp",
                                           "-x", "TROUPE_SUPERVISOR", "-x", "TROUPE_RUN_TOKEN", "./t", "a"}));
  EXPECT_EQ(sv::mpirun_command(o, "mpirun", {}, 8)[3], "--mca");  // enough cores
  auto hosts = parse({"-np", "4", "--hostfile", "h", "--", "./t"});
  EXPECT_EQ(sv::mpirun_command(hosts, "mpirun", {}, 2)[3], "--hostfile");  // the hostfile decides
}

TEST(Fault, ParsesEveryKeyAndRejectsMalformedText) {
  auto plan = sv::parse_fault("rank=1,step=37,kind=crash");
  EXPECT_EQ(plan.rank, 1);
  EXPECT_EQ(plan.step, 37u);
  EXPECT_EQ(plan.kind, sv::FaultKind::crash);
  EXPECT_FALSE(plan.restart);
  plan = sv::parse_fault("kind=hang,restart=0,step=5,rank=0");
  EXPECT_EQ(plan.kind, sv::FaultKind::hang);
  EXPECT_EQ(plan.restart, 0u);
  EXPECT_EQ(sv::parse_fault("rank=0,step=1,kind=throw").kind, sv::FaultKind::throw_error);
  EXPECT_EQ(sv::parse_fault("rank=0,step=42,kind=crash_in_save").kind, sv::FaultKind::crash_in_save);
  EXPECT_NE(error_of([] { sv::parse_fault("rank=1,step=37,kind=explode"); }).find("kind='explode'"), std::string::npos);
  EXPECT_NE(error_of([] { sv::parse_fault("rank=1,step=x,kind=crash"); }).find("step='x'"), std::string::npos);
  EXPECT_NE(error_of([] { sv::parse_fault("rank=1,kind=crash"); }).find("missing step"), std::string::npos);
  EXPECT_NE(error_of([] { sv::parse_fault("rank=1,rank=2,step=1,kind=crash"); }).find("given twice"),
            std::string::npos);
  EXPECT_NE(error_of([] { sv::parse_fault("rank=1,step=1,kind=crash,when=now"); }).find("unknown key 'when'"),
            std::string::npos);
  EXPECT_NE(error_of([] { sv::parse_fault("rank=-1,step=1,kind=crash"); }).find("rank='-1'"), std::string::npos);
  EXPECT_NE(error_of([] { sv::parse_fault("garbage"); }).find("TROUPE_FAULT='garbage'"), std::string::npos);
}

TEST(Fault, FiresOnlyOnItsRankAndLaunch) {
  auto plan = sv::parse_fault("rank=1,step=3,kind=throw,restart=0");
  EXPECT_TRUE(sv::FaultInjector(plan, 1, 0).armed());
  EXPECT_FALSE(sv::FaultInjector(plan, 0, 0).armed());
  EXPECT_FALSE(sv::FaultInjector(plan, 1, 1).armed());
  EXPECT_FALSE(sv::FaultInjector().armed());
  sv::FaultInjector injector(plan, 1, 0);
  EXPECT_NO_THROW(injector.at_step(2));
  EXPECT_THROW(injector.at_step(3), sv::FaultInjected);
  plan.restart.reset();
  EXPECT_TRUE(sv::FaultInjector(plan, 1, 7).armed());
}

TEST(Fault, FromTheEnvironmentOnlyWhenArmedAndTroupeRunArmsItsOwn) {
  ::setenv("TROUPE_FAULT", "rank=0,step=3,kind=throw", 1);
  ::unsetenv("TROUPE_FAULT_ARMED");
  EXPECT_FALSE(sv::FaultInjector::from_environment(0).armed());  // a variable left in a shell
  ::setenv("TROUPE_FAULT_ARMED", "yes", 1);
  EXPECT_FALSE(sv::FaultInjector::from_environment(0).armed());
  ::setenv("TROUPE_FAULT_ARMED", "1", 1);
  EXPECT_TRUE(sv::FaultInjector::from_environment(0).armed());
  ::unsetenv("TROUPE_FAULT");
  ::unsetenv("TROUPE_FAULT_ARMED");

  EXPECT_EQ(parse({"-np", "2", "--fault", "rank=1,step=9,kind=crash", "--", "x"}).fault, "rank=1,step=9,kind=crash");
  EXPECT_NE(error_of([] {
              parse({"-np", "2", "--fault", "rank=1,kind=crash", "--", "x"});
            }).find("missing step"),
            std::string::npos);
  sv::RunEnvironment run;
  run.fault = "rank=1,step=9,kind=crash";
  const auto launch = sv::launch_environment(run, std::chrono::milliseconds(0));
  const auto has = [&](const std::string& name, const std::string& value) {
    return std::find(launch.variables.begin(), launch.variables.end(), std::make_pair(name, value)) !=
               launch.variables.end() &&
           std::find(launch.exported.begin(), launch.exported.end(), name) != launch.exported.end();
  };
  EXPECT_TRUE(has("TROUPE_FAULT", run.fault));
  EXPECT_TRUE(has("TROUPE_FAULT_ARMED", "1"));
}

TEST(Protocol, ANoticeSurvivesARoundTripAndABadOneIsRefused) {
  const sv::Notice notice{sv::NoticeKind::save_failed, "checkpoint save of step 40 failed: ENOSPC"};
  const auto back = std::get<sv::Notice>(round_trip(notice));
  EXPECT_EQ(back.kind, sv::NoticeKind::save_failed);
  EXPECT_EQ(back.text, notice.text);
  EXPECT_EQ(sv::kind_name(sv::Message(notice)), "notice");
  EXPECT_EQ(sv::notice_name(sv::NoticeKind::started_fresh), "started_fresh");
  EXPECT_EQ(sv::notice_name(sv::NoticeKind::error), "rank_error");
  // Long text is cut to the limit on the way out, so a frame always fits.
  const auto cut = std::get<sv::Notice>(round_trip(sv::Notice{sv::NoticeKind::save_failed, std::string(5000, 'x')}));
  EXPECT_EQ(cut.text.size(), sv::kMaxNoticeText);
  auto frame = sv::encode(notice);
  frame[sv::kFrameHeader + 1] = 9;  // an unknown notice kind
  EXPECT_THROW(sv::decode_payload(frame.data() + sv::kFrameHeader, frame.size() - sv::kFrameHeader),
               troupe::FormatError);
}

TEST(EventLog, QuotesControlCharactersSoEachEventStaysOneLine) {
  EXPECT_EQ(sv::json_string("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
  EXPECT_EQ(sv::json_object({{"n", 3}, {"s", "x"}, {"raw", sv::Json::raw("[1]")}}),
            "{\"n\": 3, \"s\": \"x\", \"raw\": [1]}");
}

TEST(LaunchEnvironment, IsWhatARankReadsBack) {
  sv::RunEnvironment run{"10.0.0.1:4242",
                         sv::new_run_token(),
                         sv::new_run_id(),
                         3,
                         "/ckpt",
                         std::chrono::milliseconds(100),
                         std::chrono::milliseconds(4000),
                         "",
                         -1,
                         "/traces",
                         "2-4"};
  const auto launch = sv::launch_environment(run, std::chrono::milliseconds(2500));
  for (const auto& [name, value] : launch.variables) ::setenv(name.c_str(), value.c_str(), 1);
  const sv::RunEnvironment read = sv::run_environment();
  EXPECT_EQ(read.supervisor, run.supervisor);
  EXPECT_EQ(read.token, run.token);
  EXPECT_EQ(read.run_id, run.run_id);
  EXPECT_EQ(read.restart, 3u);
  EXPECT_EQ(read.checkpoint_dir, "/ckpt");
  EXPECT_EQ(read.heartbeat_interval.count(), 100);
  EXPECT_EQ(read.supervisor_timeout.count(), 4000);
  EXPECT_EQ(read.trace_dir, "/traces");  // troupe-run --trace, for TrainWorker's StepTrace
  EXPECT_EQ(read.trace_steps, "2-4");
  EXPECT_STREQ(std::getenv(sv::kEnvLivenessTimeout), "2500");
  // Every troupe variable reaches the other nodes; Open MPI's own need not.
  for (const auto& [name, value] : launch.variables) {
    const bool exported = std::find(launch.exported.begin(), launch.exported.end(), name) != launch.exported.end();
    EXPECT_EQ(exported, name.starts_with("TROUPE_")) << name;
  }
  for (const auto& [name, value] : launch.variables) ::unsetenv(name.c_str());

  const auto bare = sv::launch_environment(sv::RunEnvironment{}, std::chrono::milliseconds(0));
  for (const char* absent : {sv::kEnvLivenessTimeout, sv::kEnvCheckpointDir})
    EXPECT_EQ(std::count(bare.exported.begin(), bare.exported.end(), absent), 0) << absent;
}

TEST(LaunchEnvironment, ForwardsTheBlasKernelsAndTroupeSettingsToEveryNode) {
  // A node's own environment could pick other GEMM kernels: the head's choice travels.
  const std::vector<std::pair<const char*, const char*>> set = {{"OPENBLAS_CORETYPE", "Haswell"},
                                                                {"OMP_NUM_THREADS", "1"},
                                                                {sv::kEnvFault, "rank=1,step=3,kind=crash"},
                                                                {sv::kEnvRunId, "stale"},
                                                                {"UNRELATED_TROUPE_TEST_VARIABLE", "1"}};
  for (const auto& [name, value] : set) ::setenv(name, value, 1);
  const auto launch = sv::launch_environment(sv::RunEnvironment{}, std::chrono::milliseconds(0));
  for (const auto& [name, value] : set) ::unsetenv(name);
  const auto count = [&](const char* name) { return std::count(launch.exported.begin(), launch.exported.end(), name); };
  EXPECT_EQ(count("OPENBLAS_CORETYPE"), 1);
  EXPECT_EQ(count("OMP_NUM_THREADS"), 1);
  EXPECT_EQ(count(sv::kEnvFault), 1);
  EXPECT_EQ(count(sv::kEnvRunId), 1);  // set by the launch, named once
  EXPECT_EQ(count("UNRELATED_TROUPE_TEST_VARIABLE"), 0);
}

TEST(LaunchEnvironment, RunIdsSortByTimeAndTokensDoNotRepeat) {
  EXPECT_TRUE(std::regex_match(sv::new_run_id(), std::regex("[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}")));
  const std::string a = sv::new_run_token(), b = sv::new_run_token();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
}

// A full disk (here the file size limit, RLIMIT_FSIZE: writes past it fail with EFBIG
// the way they fail with ENOSPC) loses lines, never leaves half of one, and the log
// says how many it lost once it can write again.
TEST(EventLog, AFullDiskLosesWholeLinesAndTheLogSaysHowManyOnceItWritesAgain) {
  const std::string dir = ::testing::TempDir() + "troupe-eventlog-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/events.jsonl";
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &old);
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  {
    sv::EventLog log(path, "run-A");
    log.write("start");
    const auto size = static_cast<rlim_t>(std::filesystem::file_size(path));
    rlimit tight = saved;
    tight.rlim_cur = size + 40;  // room for part of a line, not a whole one
    ::setrlimit(RLIMIT_FSIZE, &tight);
    log.write("failure", {{"cause", std::string(100, 'x')}});
    log.write("restart");
    EXPECT_EQ(log.lost(), 2);
    EXPECT_EQ(std::filesystem::file_size(path), size) << "a partial line was left in the log";
    ::setrlimit(RLIMIT_FSIZE, &saved);
    log.write("finish");
    EXPECT_EQ(log.lost(), 0);
  }
  ::sigaction(SIGXFSZ, &old, nullptr);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("\"event\": \"start\""), std::string::npos);
  EXPECT_NE(lines[1].find("\"event\": \"events_lost\", \"lines\": 2"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("\"event\": \"finish\""), std::string::npos);
  std::filesystem::remove_all(dir);
}
