// Checkpoint: sections in and out, load_latest's fallbacks, keep_last and debris.
#include "troupe/checkpoint/checkpoint.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "test_util.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/state_groups.hpp"
#include "troupe/nn/adam.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/sequential.hpp"

namespace troupe::checkpoint {
namespace {

namespace fs = std::filesystem;
using tensor::DType;
using tensor::Tensor;
using testing::TempDir;

// A small model and optimizer with live Adam state, and plain counters: what a trainer
// registers. `seed` makes two differing instances.
struct Trainer {
  explicit Trainer(std::uint64_t seed) : gen(seed) {
    model.emplace<nn::Linear>(4, 8, gen);
    model.emplace<nn::Linear>(8, 3, gen);
    optimizer = std::make_unique<nn::Adam>(model.named_parameters(), 0.01);
    for (auto& [name, p] : model.named_parameters()) p->grad = Tensor::full(p->data.shape(), 0.5 + seed);
    optimizer->step();
    sampler_index = static_cast<std::int64_t>(seed * 10);
    loss = 1.0 / static_cast<double>(seed + 1);
  }

  void register_with(Checkpoint& ckpt) {
    ckpt.register_state(
        "model",
        {.save = [this](SectionWriter& w) { write_state_dict(w, model.state_dict()); },
         .load = [this](const SectionReader& r) { model.load_state_dict(read_state_dict<nn::StateDict>(r)); }});
    // Hyper-parameters and the step count as group attributes, as DESIGN.md lays it out.
    ckpt.register_state(
        "optimizer",
        {.save = [this](SectionWriter& w) { write_state_dict(w, optimizer->state_dict(), Scalars::as_attributes); },
         .load =
             [this](const SectionReader& r) {
               optimizer->load_state_dict(read_state_dict<nn::StateDict>(r, Scalars::as_attributes));
             }});
    ckpt.register_state("sampler", {.save =
                                        [this](SectionWriter& w) {
                                          w.attribute("index", sampler_index);
                                          w.attribute("loss", loss);
                                        },
                                    .load =
                                        [this](const SectionReader& r) {
                                          sampler_index = r.attributes().get_int("index");
                                          loss = r.attributes().get_double("loss");
                                        }});
  }

  tensor::Generator gen;
  nn::Sequential model;
  std::unique_ptr<nn::Optimizer> optimizer;
  std::int64_t sampler_index = 0;
  double loss = 0;
};

void expect_same(const nn::StateDict& a, const nn::StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& [name, t] : a) EXPECT_TRUE(testing::same_bits(t, b.at(name))) << name;
}

TEST(Checkpoint, RestoresModelOptimizerAndSmallStateBitForBit) {
  TempDir dir;
  Trainer saved(1);
  Checkpoint out(dir.path(), 3);
  out.set_run_info({.run_id = "run-7", .config_json = "{\"lr\": 0.01}", .world_size = 2});
  saved.register_with(out);
  fs::path file = out.save(120, 4);
  EXPECT_EQ(file.filename(), "ckpt-000000120.h5");

  Trainer fresh(2);
  Checkpoint in(dir.path(), 3);
  fresh.register_with(in);
  std::optional<Metadata> meta = in.load_latest();
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->step, 120);
  EXPECT_EQ(meta->epoch, 4);
  EXPECT_EQ(meta->world_size, 2);
  EXPECT_EQ(meta->run_id, "run-7");
  EXPECT_EQ(meta->config_json, "{\"lr\": 0.01}");
  EXPECT_EQ(meta->path, file);
  EXPECT_EQ(meta->created_utc.size(), 20u);  // 2026-11-23T11:40:00Z
  expect_same(fresh.model.state_dict(), saved.model.state_dict());
  expect_same(fresh.optimizer->state_dict(), saved.optimizer->state_dict());
  EXPECT_EQ(fresh.sampler_index, saved.sampler_index);
  EXPECT_EQ(fresh.loss, saved.loss);

  // Optimizer slots land in subgroups, as the format describes.
  FileReader reader(file.string());
  EXPECT_TRUE(reader.has_group("/optimizer/0.weight"));
  EXPECT_NO_THROW(reader.info("/optimizer/0.weight/exp_avg"));
  EXPECT_NO_THROW(reader.info("/model/1.bias"));
  Attributes hyper = reader.attributes("/optimizer");
  EXPECT_EQ(hyper.get_double("lr"), 0.01);
  EXPECT_EQ(hyper.get_int("step"), 1);
  EXPECT_FALSE(reader.has_group("/optimizer/lr"));
}

// The shape of train::TrainingState: every group at once, out and back in.
struct GroupedState {
  using Groups = std::vector<std::pair<std::string, nn::StateDict>>;
  Groups state_dicts() const {
    Groups g;
    g.emplace_back("model", trainer->model.state_dict());
    g.emplace_back("optimizer", trainer->optimizer->state_dict());
    nn::StateDict sampler;
    sampler.insert("epoch", Tensor::full({}, 3, DType::i64));
    sampler.insert("position", Tensor::full({}, static_cast<double>(trainer->sampler_index), DType::i64));
    sampler.insert("permutation", Tensor::arange(0, 5, 1, DType::i64));
    g.emplace_back("sampler", std::move(sampler));
    return g;
  }
  void load_state_dicts(const Groups& groups) {
    ++loads;
    ASSERT_EQ(groups.size(), 3u);
    trainer->model.load_state_dict(groups[0].second);
    trainer->optimizer->load_state_dict(groups[1].second);
    trainer->sampler_index = static_cast<std::int64_t>(groups[2].second.at("position").item());
    sampler_keys = groups[2].second.keys();
  }
  Trainer* trainer;
  int loads = 0;
  std::vector<std::string> sampler_keys;
};

TEST(Checkpoint, StateGroupsLandAsSectionsWithSmallScalarsAsAttributes) {
  TempDir dir;
  Trainer saved(1), fresh(2);
  GroupedState out{&saved, 0, {}}, in{&fresh, 0, {}};
  {
    Checkpoint ckpt(dir.path(), 1);
    register_state_groups(ckpt, out, {"model", "optimizer", "sampler"});
    ckpt.save(5);
  }
  FileReader file((dir / "ckpt-000000005.h5").string());
  EXPECT_EQ(file.attributes("/sampler").get_int("position"), 10);
  EXPECT_EQ(file.attributes("/optimizer").get_double("lr"), 0.01);
  EXPECT_NO_THROW(file.info("/sampler/permutation"));

  Checkpoint ckpt(dir.path(), 1);
  register_state_groups(ckpt, in);  // the groups the source has: the same three
  ASSERT_TRUE(ckpt.load_latest());
  EXPECT_EQ(in.loads, 1);
  expect_same(fresh.model.state_dict(), saved.model.state_dict());
  expect_same(fresh.optimizer->state_dict(), saved.optimizer->state_dict());
  EXPECT_EQ(fresh.sampler_index, 10);
  EXPECT_EQ(in.sampler_keys, (std::vector<std::string>{"epoch", "position", "permutation"}));
}

TEST(Checkpoint, AnEmptyFolderHasNothingToLoad) {
  TempDir dir;
  Trainer t(1);
  Checkpoint ckpt(dir / "new", 3);
  t.register_with(ckpt);
  EXPECT_FALSE(ckpt.load_latest());
  EXPECT_TRUE(fs::is_directory(dir / "new"));
}

// Saves steps 1, 2, 3 with distinct states; returns each state's sampler index.
void save_three(const fs::path& folder, std::size_t keep_last = 0) {
  for (std::int64_t step = 1; step <= 3; ++step) {
    Trainer t(static_cast<std::uint64_t>(step));
    Checkpoint ckpt(folder, keep_last);
    t.register_with(ckpt);
    ckpt.save(step);
  }
}

struct Loaded {
  std::optional<Metadata> meta;
  std::vector<std::string> warnings;
  std::int64_t sampler_index = -1;
};

Loaded load(const fs::path& folder) {
  Trainer t(99);
  Checkpoint ckpt(folder, 0);
  t.register_with(ckpt);
  Loaded out;
  ckpt.set_warning_handler([&](const std::string& w) { out.warnings.push_back(w); });
  out.meta = ckpt.load_latest();
  out.sampler_index = t.sampler_index;
  return out;
}

TEST(Checkpoint, LoadLatestSkipsACorruptNewestFileNamingItAndUsesThePrevious) {
  TempDir dir;
  save_three(dir.path());
  fs::path newest = dir / "ckpt-000000003.h5";
  std::vector<char> bytes = testing::read_bytes(newest);
  // Flip a byte in the last tensor data (model data sits before the root's last attribute).
  Trainer probe(3);
  Tensor w = probe.model.state_dict().at("0.weight");
  const char* needle = static_cast<const char*>(w.raw_data());
  auto at = std::search(bytes.begin(), bytes.end(), needle, needle + w.nbytes());
  ASSERT_NE(at, bytes.end());
  at[5] ^= 0x40;
  testing::write_bytes(newest, bytes);

  Loaded got = load(dir.path());
  ASSERT_TRUE(got.meta);
  EXPECT_EQ(got.meta->step, 2);
  EXPECT_EQ(got.sampler_index, 20);
  ASSERT_EQ(got.warnings.size(), 1u);
  EXPECT_NE(got.warnings[0].find("ckpt-000000003.h5"), std::string::npos) << got.warnings[0];
  EXPECT_NE(got.warnings[0].find("checksum mismatch"), std::string::npos) << got.warnings[0];
}

TEST(Checkpoint, VerifyingWhileRestoringFallsBackAndRestoresAllOfThePreviousOrThrows) {
  TempDir dir;
  save_three(dir.path());
  for (const char* name : {"ckpt-000000003.h5", "ckpt-000000002.h5", "ckpt-000000001.h5"}) {
    // Damage the last tensor of /optimizer, read after /model has been restored.
    std::vector<char> bytes = testing::read_bytes(dir / name);
    Trainer probe(static_cast<std::uint64_t>(name[13] - '0'));
    Tensor slot = probe.optimizer->state_dict().at("1.bias/exp_avg_sq");
    const char* needle = static_cast<const char*>(slot.raw_data());
    auto at = std::search(bytes.begin(), bytes.end(), needle, needle + slot.nbytes());
    ASSERT_NE(at, bytes.end()) << name;
    at[1] ^= 0x08;
    testing::write_bytes(dir / name, bytes);

    Trainer t(99);
    Checkpoint ckpt(dir.path(), 0);
    t.register_with(ckpt);
    ckpt.set_verify(Verify::while_restoring);
    std::vector<std::string> warnings;
    ckpt.set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
    if (std::string(name) != "ckpt-000000001.h5") {
      std::optional<Metadata> meta = ckpt.load_latest();
      ASSERT_TRUE(meta);
      Trainer expected(static_cast<std::uint64_t>(meta->step));
      expect_same(t.model.state_dict(), expected.model.state_dict());  // all of it from the older file
      expect_same(t.optimizer->state_dict(), expected.optimizer->state_dict());
      EXPECT_NE(warnings.back().find("partly restored"), std::string::npos) << warnings.back();
    } else {
      try {
        ckpt.load_latest();
        FAIL() << "every checkpoint is damaged, yet load_latest returned";
      } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find("not usable"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Checkpoint, LoadLatestSkipsTruncatedFilesAndAStaleLatestPointer) {
  TempDir dir;
  save_three(dir.path());
  fs::resize_file(dir / "ckpt-000000003.h5", fs::file_size(dir / "ckpt-000000003.h5") / 2);
  fs::resize_file(dir / "ckpt-000000002.h5", 10);
  Loaded got = load(dir.path());
  ASSERT_TRUE(got.meta);
  EXPECT_EQ(got.meta->step, 1);
  EXPECT_EQ(got.sampler_index, 10);
  EXPECT_EQ(got.warnings.size(), 2u);

  fs::remove(dir / "ckpt-000000003.h5");  // `latest` now names a missing file
  got = load(dir.path());
  ASSERT_TRUE(got.meta);
  EXPECT_EQ(got.meta->step, 1);
}

TEST(Checkpoint, AFileMissingARequiredSectionIsSkippedAnOptionalOneIsNot) {
  TempDir dir;
  save_three(dir.path());
  int extra_loads = 0;
  {
    Trainer t(5);
    Checkpoint ckpt(dir.path(), 0);
    t.register_with(ckpt);
    ckpt.register_state(
        "best",
        {.save = [](SectionWriter&) {}, .load = [&](const SectionReader&) { ++extra_loads; }, .required = false});
    std::optional<Metadata> meta = ckpt.load_latest();
    ASSERT_TRUE(meta);
    EXPECT_EQ(meta->step, 3);
    EXPECT_EQ(extra_loads, 0);
  }
  Trainer t(5);
  Checkpoint ckpt(dir.path(), 0);
  t.register_with(ckpt);
  ckpt.register_state("scaler", {.save = [](SectionWriter&) {}, .load = [](const SectionReader&) {}});
  std::vector<std::string> warnings;
  ckpt.set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  // Files of another configuration are skipped, not set aside as damaged; and a folder
  // of them is no reason to start over.
  EXPECT_THROW(ckpt.load_latest(), CheckpointError);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_NE(warnings[0].find("no section /scaler"), std::string::npos) << warnings[0];
  EXPECT_TRUE(ckpt.directory().quarantined().empty());
  EXPECT_EQ(ckpt.directory().list().size(), 3u);
}

TEST(Checkpoint, KeepLastRemovesOnlyOlderCheckpointsAndLatestNamesTheNewest) {
  TempDir dir;
  Trainer t(1);
  Checkpoint ckpt(dir.path(), 2);
  t.register_with(ckpt);
  for (std::int64_t step : {10, 20, 30, 40}) ckpt.save(step);
  std::vector<fs::path> left = ckpt.directory().list();
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].filename(), "ckpt-000000030.h5");
  EXPECT_EQ(left[1].filename(), "ckpt-000000040.h5");
  std::ifstream latest(dir / "latest");
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "ckpt-000000040.h5");
}

TEST(Checkpoint, ASaveOfALowerStepAfterAResumeIsKeptAndBecomesLatest) {
  TempDir dir;
  Trainer t(1);
  Checkpoint ckpt(dir.path(), 2);
  t.register_with(ckpt);
  for (std::int64_t step : {100, 200}) ckpt.save(step);
  ckpt.save(150);  // resumed from 100 (say 200 was bad) and saving again
  std::vector<fs::path> left = ckpt.directory().list();
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(left[0].filename(), "ckpt-000000150.h5");
  EXPECT_EQ(left[1].filename(), "ckpt-000000200.h5");
  std::optional<Metadata> meta = ckpt.load_latest();
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->step, 150);
  Checkpoint one(dir.path(), 1);
  t.register_with(one);
  one.save(120);
  ASSERT_EQ(one.directory().list().size(), 1u);
  EXPECT_EQ(one.directory().list()[0].filename(), "ckpt-000000120.h5");
}

TEST(Checkpoint, DebrisOfADeadWriterIsIgnoredThenCleanedUp) {
  TempDir dir;
  save_three(dir.path());
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: the pid is gone
  fs::path debris = dir / (".ckpt-000000004.h5.tmp-" + std::to_string(child));
  testing::write_bytes(debris, std::vector<char>(5000, 'z'));
  fs::path own = dir / (".ckpt-000000005.h5.tmp-" + std::to_string(getpid()));
  testing::write_bytes(own, std::vector<char>(10, 'z'));  // "in flight" in this process

  Loaded got = load(dir.path());
  ASSERT_TRUE(got.meta);
  EXPECT_EQ(got.meta->step, 3);
  // One warning, naming the dead writer's file only (our own save in flight is no debris).
  ASSERT_EQ(got.warnings.size(), 1u);
  EXPECT_NE(got.warnings[0].find("ignoring unfinished checkpoint " + debris.string()), std::string::npos)
      << got.warnings[0];

  Trainer t(4);
  Checkpoint ckpt(dir.path(), 0);
  t.register_with(ckpt);
  ckpt.save(4);
  EXPECT_FALSE(fs::exists(debris));
  EXPECT_TRUE(fs::exists(own));
}

TEST(Checkpoint, RegistrationMistakesAreRefused) {
  TempDir dir;
  Checkpoint ckpt(dir.path());
  StateSource ok{.save = [](SectionWriter&) {}, .load = [](const SectionReader&) {}};
  ckpt.register_state("model", ok);
  EXPECT_THROW(ckpt.register_state("model", ok), InvalidArgument);
  EXPECT_THROW(ckpt.register_state("a/b", ok), InvalidArgument);
  EXPECT_THROW(ckpt.register_state("", ok), InvalidArgument);
  EXPECT_THROW(ckpt.register_state("x", StateSource{}), InvalidArgument);
  EXPECT_THROW(ckpt.save(1'000'000'000), InvalidArgument);
}

TEST(Checkpoint, AFailingSaveLeavesNoFileAndThePreviousCheckpointLatest) {
  TempDir dir;
  Checkpoint ckpt(dir.path());
  bool fail = false;
  ckpt.register_state("model", {.save =
                                    [&](SectionWriter& w) {
                                      w.tensor("w", Tensor::ones({3}));
                                      if (fail) throw Error("deliberate failure in a state source");
                                    },
                                .load = [](const SectionReader&) {}});
  ckpt.save(1);
  fail = true;
  EXPECT_THROW(ckpt.save(2), Error);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt-000000001.h5", "latest"}));
}

}  // namespace
}  // namespace troupe::checkpoint
