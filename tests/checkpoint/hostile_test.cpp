// Crafted files (tests/checkpoint/hostile_files.py) as the newest checkpoint of a run:
// a link cycle, a dataset declaring 8.6 GB in a 3 KB file, an element count that
// overflows, an external link to a FIFO, data in an external file, a soft link, a name
// with control characters, a rank above HDF5's limit. Resume must set each aside as
// damaged, quickly, and load the checkpoint before it. And format 1 files, whose strings
// libhdf5 reads unchecked, are read only when asked.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "test_util.hpp"
#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/file_writer.hpp"

namespace troupe::checkpoint {
namespace {

namespace fs = std::filesystem;
using tensor::DType;
using tensor::Tensor;

Tensor step_state(std::int64_t step) {
  return testing::random_tensor({8, 8}, DType::f32, static_cast<std::uint32_t>(step));
}

// A Checkpoint of one tensor whose value is a function of the step, with its warnings kept.
struct Resumer {
  explicit Resumer(const fs::path& folder) : ckpt(folder, 3) {
    ckpt.set_warning_handler([this](const std::string& w) { warnings += w + "\n"; });
    ckpt.register_state("model", {.save = [this](SectionWriter& w) { w.tensor("w", step_state(step)); },
                                  .load = [this](const SectionReader& r) { loaded = r.tensor("w"); }});
  }
  void save(std::int64_t s) {
    step = s;
    ckpt.save(s);
  }
  Checkpoint ckpt;
  std::int64_t step = 0;
  Tensor loaded;
  std::string warnings;
};

struct Crafted {
  const char* name;     // hostile_files.py's file, without .h5
  const char* keyword;  // a word the refusal names it by
  // How gtest (and so ctest's test list) shows the parameter: by name, not its bytes.
  friend void PrintTo(const Crafted& c, std::ostream* out) { *out << c.name; }
};

class HostileCheckpoint : public ::testing::TestWithParam<Crafted> {
 protected:
  // The generator runs once (h5py takes a moment to start); each test copies its file.
  static void SetUpTestSuite() {
    crafted_ = new testing::TempDir;
    const std::string cmd = "/usr/bin/python3 " TROUPE_SOURCE_DIR "/tests/checkpoint/hostile_files.py " +
                            crafted_->path().string() + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    delete crafted_;
    crafted_ = nullptr;
  }
  static testing::TempDir* crafted_;
};

testing::TempDir* HostileCheckpoint::crafted_ = nullptr;

TEST_P(HostileCheckpoint, AsTheNewestCheckpointIsSetAsideAndResumeLoadsTheOneBefore) {
  const fs::path crafted = crafted_->path() / (std::string(GetParam().name) + ".h5");
  if (!fs::exists(crafted)) GTEST_SKIP() << "hostile_files.py could not craft " << crafted;
  testing::TempDir dir;
  {
    Resumer writer(dir.path());
    writer.save(1);
    writer.save(2);  // `latest` names step 2, so resume tries the crafted file first
  }
  fs::copy_file(crafted, dir / "ckpt-000000002.h5", fs::copy_options::overwrite_existing);
  // What the external link and the external storage name: a FIFO, which blocks whoever
  // opens it for reading until a writer comes, that is forever.
  ASSERT_EQ(::mkfifo((dir / "hostile.fifo").c_str(), 0600), 0);

  Resumer reader(dir.path());
  const auto start = std::chrono::steady_clock::now();
  const std::optional<Metadata> meta = reader.ckpt.load_latest();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(meta) << reader.warnings;
  EXPECT_EQ(meta->step, 1) << reader.warnings;
  EXPECT_TRUE(testing::same_bits(reader.loaded, step_state(1)));
  EXPECT_TRUE(fs::exists(dir / "ckpt-000000002.h5.damaged"));
  EXPECT_FALSE(fs::exists(dir / "ckpt-000000002.h5"));
  EXPECT_NE(reader.warnings.find("set aside as ckpt-000000002.h5.damaged"), std::string::npos) << reader.warnings;
  EXPECT_NE(reader.warnings.find(GetParam().keyword), std::string::npos) << reader.warnings;
  EXPECT_LT(seconds, 5.0) << reader.warnings;
}

INSTANTIATE_TEST_SUITE_P(Crafted, HostileCheckpoint,
                         ::testing::Values(Crafted{"link_cycle", "cycle"}, Crafted{"huge_declared", "2147483648"},
                                           Crafted{"overflow", "overflow"}, Crafted{"external_link", "external link"},
                                           Crafted{"external_storage", "external storage"},
                                           Crafted{"soft_link", "soft link"},
                                           Crafted{"control_name", "bad\\x0aname\\x1b[31m"},
                                           Crafted{"rank_33", "dataspace"}),
                         [](const ::testing::TestParamInfo<Crafted>& info) { return std::string(info.param.name); });

// A format 1 file: written, then rewritten by as_format1.py (strings variable-length).
std::string format_one_file(const testing::TempDir& dir) {
  const std::string file = (dir / "old.h5").string();
  {
    FileWriter out(file);
    out.write_tensor("/model/w", Tensor::ones({3}));
    out.close();
  }
  const std::string cmd = "/usr/bin/python3 " TROUPE_SOURCE_DIR "/tests/checkpoint/as_format1.py " + file;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return file;
}

TEST(HostileFiles, AFormatOneFileIsReadOnlyWhenAsked) {
  testing::TempDir dir;
  const std::string file = format_one_file(dir);
  try {
    FileReader refused(file);
    FAIL() << "a format 1 file was opened without allow_format_1";
  } catch (const FormatError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find("--allow-format-1"), std::string::npos) << what;
  }
  FileReader asked(file, {.allow_format_1 = true});
  EXPECT_EQ(asked.attributes("/").get_string("format_version"), "1.0");
  asked.verify_all();
}

// As the newest checkpoint, a format 1 file is an older troupe's, not damage: resume
// skips it without setting it aside, and takes it when asked to.
TEST(HostileFiles, AFormatOneCheckpointIsSkippedNotSetAsideAndResumedWhenAsked) {
  testing::TempDir dir;
  {
    Resumer first(dir.path());
    first.save(1);
    first.save(2);
  }
  const std::string newest = (dir / "ckpt-000000002.h5").string();
  const std::string cmd = "/usr/bin/python3 " TROUPE_SOURCE_DIR "/tests/checkpoint/as_format1.py " + newest;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Resumer resumer(dir.path());
  ASSERT_EQ(resumer.ckpt.load_latest()->step, 1);
  EXPECT_TRUE(fs::exists(newest)) << resumer.warnings;
  EXPECT_TRUE(resumer.ckpt.directory().quarantined().empty());
  Resumer asked(dir.path());
  asked.ckpt.set_read_options({.allow_format_1 = true});
  EXPECT_EQ(asked.ckpt.load_latest()->step, 2);
  EXPECT_TRUE(testing::same_bits(asked.loaded, step_state(2)));
}

TEST(HostileFiles, TroupeCkptReadsAFormatOneFileOnlyWithAllowFormat1) {
  testing::TempDir dir;
  const std::string file = format_one_file(dir);
  const std::string tool = std::string(TROUPE_CKPT_BINARY) + " verify " + file + " > /dev/null 2>&1";
  int status = std::system(tool.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  status = std::system((std::string(TROUPE_CKPT_BINARY) + " verify --allow-format-1 " + file + " > /dev/null").c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// The shape of a file troupe writes passes every check, and the checks cost no reads:
// listing a file of many tensors stays as quick as opening it.
TEST(HostileFiles, WhatTroupeWritesPassesEveryCheck) {
  testing::TempDir dir;
  const std::string file = (dir / "many.h5").string();
  {
    FileWriter out(file);
    for (int i = 0; i < 200; ++i)
      out.write_tensor("/optimizer/layer" + std::to_string(i) + ".weight/exp_avg", Tensor::ones({4, 4}));
    out.write_tensor("/model/scalar", Tensor::ones({}));
    out.write_tensor("/model/empty", Tensor::empty({0, 5}, DType::bf16));
    out.close();
  }
  FileReader in(file);
  EXPECT_EQ(in.tensors("/").size(), 202u);
  EXPECT_EQ(in.groups("/").size(), 202u);  // /optimizer, its 200 groups, /model
  in.verify_all();
  EXPECT_EQ(in.info("/model/empty").nbytes(), 0u);
}

}  // namespace
}  // namespace troupe::checkpoint
