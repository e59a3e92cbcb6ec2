// troupe-ckpt, run as a process: output, --json, --help and exit statuses, and clear
// errors for a missing, non-HDF5, truncated or foreign file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "test_util.hpp"
#include "troupe/checkpoint/checkpoint.hpp"

namespace troupe::checkpoint {
namespace {

namespace fs = std::filesystem;
using tensor::DType;
using tensor::Tensor;

struct ToolRun {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TroupeCkpt : public ::testing::Test {
 protected:
  ToolRun run(const std::string& arguments) {
    std::string cmd = std::string(TROUPE_CKPT_BINARY) + " " + arguments + " >" + (dir_ / "stdout").string() + " 2>" +
                      (dir_ / "stderr").string();
    int status = std::system(cmd.c_str());
    ToolRun r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(dir_ / "stdout");
    r.err = slurp(dir_ / "stderr");
    return r;
  }
  // True when python's json module parses `text`.
  bool is_json(const std::string& text) {
    testing::write_bytes(dir_ / "out.json", std::vector<char>(text.begin(), text.end()));
    std::string cmd =
        "/usr/bin/python3 -c \"import json,sys; json.load(open(sys.argv[1]))\" " + (dir_ / "out.json").string();
    return std::system(cmd.c_str()) == 0;
  }

  // Step 5 (and a variant at step 6 when `changed`): known values, a NaN and an Inf.
  std::string make(std::int64_t step, bool changed = false, bool extra = false) {
    Checkpoint ckpt(dir_ / "ckpt", 0);
    ckpt.set_run_info({.run_id = "tool-run", .config_json = "{\"lr\": 0.1}", .world_size = 2});
    ckpt.register_state(
        "model", {.save =
                      [&](SectionWriter& w) {
                        float last = changed ? 4.5f : 4.0f;
                        w.tensor("fc.weight", Tensor::from_vector<float>({1, 2, 3, last, NAN, INFINITY}, {2, 3}));
                        w.tensor("fc.bias", Tensor::from_vector<float>({0.5f, -0.5f}).to(DType::bf16));
                        w.tensor("steps", Tensor::arange(0, 4, 1, DType::i64));
                        if (extra) w.tensor("new.weight", Tensor::ones({2}));
                      },
                  .load = [](const SectionReader&) {}});
    ckpt.register_state("sampler",
                        {.save = [&](SectionWriter& w) { w.attribute("index", std::int64_t{changed ? 7 : 3}); },
                         .load = [](const SectionReader&) {}});
    return ckpt.save(step).string();
  }

  testing::TempDir dir_;
};

TEST_F(TroupeCkpt, LsListsTensorsWithDTypesShapesAndTotals) {
  std::string f = make(5);
  ToolRun r = run("ls " + f);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("/model/fc.weight  f32    [2, 3]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/model/fc.bias    bf16   [2]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 tensors, 60 B (60 bytes)"), std::string::npos) << r.out;
  r = run("ls --json " + f);
  EXPECT_EQ(r.rc, 0);
  EXPECT_TRUE(is_json(r.out)) << r.out;
  EXPECT_NE(r.out.find("{\"name\": \"/model/steps\", \"dtype\": \"i64\", \"shape\": [4], \"bytes\": 32}"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"bytes\": 60}"), std::string::npos) << r.out;
}

TEST_F(TroupeCkpt, ShowGivesStatisticsCountingNanAndInf) {
  std::string f = make(5);
  ToolRun r = run("show " + f + " fc.weight");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("min 1  max 4  mean 2.5  std 1.11803  l2 5.47723  nan 1  inf 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first 6: 1, 2, 3, 4, nan, inf"), std::string::npos) << r.out;
  r = run("show " + f + " /model/fc.bias --json --count 1");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(is_json(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"dtype\": \"bf16\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"first\": [0.5]"), std::string::npos) << r.out;
  r = run("show " + f + " no.such");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("no tensor 'no.such'"), std::string::npos) << r.err;
}

TEST_F(TroupeCkpt, MetaShowsRootAttributesConfigAndSmallState) {
  std::string f = make(5);
  ToolRun r = run("meta " + f);
  EXPECT_EQ(r.rc, 0) << r.err;
  for (const char* s : {"format = troupe-checkpoint", "step = 5", "world_size = 2", "run_id = tool-run",
                        "config = {\"lr\": 0.1}", "/sampler\n  index = 3"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in\n" << r.out;
  r = run("meta --json " + f);
  EXPECT_TRUE(is_json(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"config\": \"{\\\"lr\\\": 0.1}\""), std::string::npos) << r.out;
}

TEST_F(TroupeCkpt, VerifyGivesTheVerdictInItsExitStatus) {
  std::string good = make(5);
  std::string bad = make(6, true);
  ToolRun r = run("verify " + good);
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  r = run("verify " + (dir_ / "ckpt").string());
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("latest -> ckpt-000000006.h5"), std::string::npos) << r.out;

  std::vector<char> bytes = testing::read_bytes(bad);
  std::vector<char> steps(32);
  for (int i = 0; i < 4; ++i) {
    std::int64_t v = i;
    std::memcpy(steps.data() + 8 * i, &v, 8);
  }
  auto at = std::search(bytes.begin(), bytes.end(), steps.begin(), steps.end());
  ASSERT_NE(at, bytes.end());
  at[8] = 9;
  testing::write_bytes(bad, bytes);
  testing::write_bytes(dir_ / "ckpt" / (".ckpt-000000007.h5.tmp-999999"), std::vector<char>(10));
  r = run("verify " + bad);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("INVALID"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/model/steps: checksum mismatch"), std::string::npos) << r.out;
  r = run("verify --json " + (dir_ / "ckpt").string());
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(is_json(r.out)) << r.out;
  EXPECT_NE(r.out.find("\"valid\": false"), std::string::npos);
  EXPECT_NE(r.out.find(".ckpt-000000007.h5.tmp-999999"), std::string::npos) << r.out;
  r = run("verify " + (dir_ / "nothing").string());
  EXPECT_EQ(r.rc, 2);
}

TEST_F(TroupeCkpt, DiffExitsZeroOnlyWhenBitForBitIdentical) {
  std::string a = make(5);
  fs::copy_file(a, dir_ / "copy.h5");
  ToolRun r = run("diff " + a + " " + (dir_ / "copy.h5").string());
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("identical: 3 of 3 tensors identical"), std::string::npos) << r.out;

  std::string b = make(6, /*changed=*/true, /*extra=*/true);
  r = run("diff " + a + " " + b);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.out.find("different  /model/fc.weight  max abs 0.5  max rel 0.111111  (1 elements)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("extra  /model/new.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attribute /sampler index: 3 -> 7"), std::string::npos) << r.out;
  r = run("diff --json " + b + " " + a);
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(is_json(r.out)) << r.out;
  EXPECT_NE(r.out.find("{\"name\": \"/model/new.weight\", \"status\": \"missing\""), std::string::npos) << r.out;
  r = run("diff " + a + " " + (dir_ / "absent.h5").string());
  EXPECT_EQ(r.rc, 2);
}

TEST_F(TroupeCkpt, ExportWritesSafetensorsThatPythonReadsBack) {
  std::string f = make(5);
  std::string out = (dir_ / "model.safetensors").string();
  ToolRun r = run("export " + f + " --to " + out);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("wrote 3 tensors"), std::string::npos) << r.out;
  std::string cmd = "/usr/bin/python3 " TROUPE_SOURCE_DIR "/tests/checkpoint/check_safetensors.py " + out + " " + f;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  r = run("export " + f);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("needs --to"), std::string::npos) << r.err;
}

TEST_F(TroupeCkpt, EveryCommandHasHelpAndFailsClearlyOnBadFiles) {
  std::string good = make(5);
  testing::write_bytes(dir_ / "text.h5", std::vector<char>(500, 'x'));
  std::vector<char> bytes = testing::read_bytes(good);
  testing::write_bytes(dir_ / "cut.h5", std::vector<char>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  std::string foreign = (dir_ / "foreign.h5").string();
  ASSERT_EQ(std::system(("/usr/bin/python3 -c \"import h5py; h5py.File('" + foreign + "', 'w')['x'] = [1]\"").c_str()),
            0);

  struct Case {
    const char* file;
    const char* message;
  };
  const Case cases[] = {{"absent.h5", "no such file"},
                        {"text.h5", "not an HDF5 file"},
                        {"cut.h5", "truncated"},
                        {"foreign.h5", "not a troupe checkpoint"}};
  for (std::string command : {"ls", "show", "meta", "verify", "diff", "export"}) {
    ToolRun h = run(command + " --help");
    EXPECT_EQ(h.rc, 0) << command;
    EXPECT_NE(h.out.find("usage: troupe-ckpt " + command), std::string::npos) << h.out;
    for (const Case& c : cases) {
      std::string path = (dir_ / c.file).string();
      std::string args = command + " " + path;
      if (command == "show") args += " fc.weight";
      if (command == "diff") args += " " + good;
      if (command == "export") args += " --to " + (dir_ / "x.safetensors").string();
      ToolRun r = run(args);
      int expected = (command == "verify" && std::string(c.file) != "absent.h5") ? 1 : 2;
      EXPECT_EQ(r.rc, expected) << args << "\n" << r.out << r.err;
      EXPECT_NE((r.out + r.err).find(c.message), std::string::npos) << args << "\n" << r.out << r.err;
    }
  }
  ToolRun r = run("frobnicate");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos);
  r = run("ls " + good + " --bogus");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("unknown option --bogus for 'ls'"), std::string::npos) << r.err;
  EXPECT_EQ(run("--help").rc, 0);
  EXPECT_EQ(run("").rc, 2);
}

}  // namespace
}  // namespace troupe::checkpoint
