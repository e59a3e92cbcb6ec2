// Status and BestModelKeeper: local reporting on the primary rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>

#include "train_world.hpp"
#include "troupe/error.hpp"
#include "troupe/train/best_model_keeper.hpp"
#include "troupe/train/status.hpp"

namespace troupe::train {
namespace {

// Per-rank file names: every rank runs these tests at the same time.
std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "train_" + std::to_string(testing::world().rank()) + "_" + name;
}

std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string text;
  char buffer[4096];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) text.append(buffer, n);
  return text;
}

TEST(Status, AppendsOneJsonLinePerLogWithStepEpochMetricsRateAndWallTime) {
  const std::string path = temp_path("metrics.jsonl");
  std::remove(path.c_str());
  {
    Status status(true, {.metrics_path = path, .out = stderr});
    status.log(10, 1, {{"loss", 0.5}, {"acc", NAN}}, 1234.5);
  }
  {
    Status resumed(true, {.metrics_path = path, .out = stderr});  // a resumed run appends
    resumed.log(20, 2, {{"loss", 0.25}}, -1);
  }
  std::ifstream in(path);
  std::string first, second, third;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_FALSE(std::getline(in, third));
  EXPECT_TRUE(std::regex_match(first, std::regex(R"(\{"step": 10, "epoch": 1, "loss": 0.5, "acc": null, )"
                                                 R"("samples_per_s": 1234.5, "wall_s": [0-9.e-]+\})")))
      << first;
  EXPECT_TRUE(std::regex_match(second, std::regex(R"(\{"step": 20, "epoch": 2, "loss": 0.25, "wall_s": [0-9.e-]+\})")))
      << second;
}

TEST(Status, DoesNothingOnOtherRanks) {
  const std::string path = temp_path("not_primary.jsonl");
  std::remove(path.c_str());
  std::FILE* out = std::tmpfile();
  {
    Status status(false, {.metrics_path = path, .out = out});
    status.summary({{"model", "x"}});
    status.begin_epoch(1, 1, 10);
    status.progress(5, 50);
    status.print("hello");
    status.log(1, 1, {{"loss", 1}}, 1);
  }
  EXPECT_EQ(read_all(out), "");
  EXPECT_FALSE(std::ifstream(path).good()) << "a non-primary rank must not create the metrics file";
  std::fclose(out);
}

TEST(Status, DrawsABarInPlaceOnATerminalAndPlainLinesOtherwise) {
  std::FILE* out = std::tmpfile();
  {
    Status bar(true, {.metrics_path = {}, .out = out, .progress_bar = 1});
    bar.summary({{"model", "MLP, 42 parameters"}});
    bar.begin_epoch(1, 3, 4);
    for (int i = 1; i <= 4; ++i) bar.progress(i, 16 * i, {{"loss", 0.5}});
    bar.print("epoch 1 done");
  }
  const std::string text = read_all(out);
  EXPECT_NE(text.find("== start ==\nmodel:     MLP, 42 parameters\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\r\033[Kepoch 1/3 [========================] 4/4"), std::string::npos) << text;
  EXPECT_NE(text.find("ETA"), std::string::npos);
  EXPECT_NE(text.find("\r\033[Kepoch 1 done\n"), std::string::npos) << text;
  std::fclose(out);

  std::FILE* plain_out = std::tmpfile();
  {
    Status plain(true, {.metrics_path = {}, .out = plain_out, .progress_bar = 0, .plain_interval_s = 0});
    plain.begin_epoch(2, 3, 2);
    plain.progress(1, 8);
    plain.progress(2, 16);
  }
  const std::string plain_text = read_all(plain_out);
  EXPECT_EQ(plain_text.find('\r'), std::string::npos) << "no carriage returns in a log file";
  EXPECT_NE(plain_text.find("epoch 2/3 step 2/2"), std::string::npos) << plain_text;
  std::fclose(plain_out);
}

nn::StateDict weights(float v) {
  nn::StateDict d;
  d.insert("w", Tensor::full({2, 2}, v));
  return d;
}

TEST(BestModelKeeper, KeepsACopyOfTheBestStateByMinOrMax) {
  BestModelKeeper max_acc("acc", "max");
  nn::StateDict live = weights(1);
  EXPECT_TRUE(max_acc.update({{"acc", 0.5}}, live, 1));
  live.at("w");  // the keeper's copy must not follow later changes of the live tensors
  const_cast<Tensor&>(live.at("w")).fill_(7);
  EXPECT_FALSE(max_acc.update({{"acc", 0.4}}, live, 2));
  EXPECT_FALSE(max_acc.update({{"acc", 0.5}}, live, 3)) << "a tie keeps the earlier model";
  EXPECT_EQ(max_acc.best_state().at("w").to_vector<float>()[0], 1.0f);
  EXPECT_TRUE(max_acc.update({{"acc", 0.9}}, weights(3), 4));
  EXPECT_EQ(max_acc.best_step(), 4);
  EXPECT_DOUBLE_EQ(max_acc.best_value(), 0.9);

  BestModelKeeper min_loss("loss", "min");
  EXPECT_TRUE(min_loss.update({{"loss", 2.0}}, weights(1), 1));
  EXPECT_TRUE(min_loss.update({{"loss", 1.0}}, weights(2), 2));
  EXPECT_FALSE(min_loss.update({{"loss", NAN}}, weights(3), 3));
  EXPECT_THROW(min_loss.update({{"acc", 1.0}}, weights(3), 4), InvalidArgument);
  EXPECT_THROW(BestModelKeeper("loss", "lowest"), InvalidArgument);
}

TEST(BestModelKeeper, WritesTheBestModelToAFileThatLoadsBackAndRefusesATruncatedOne) {
  const std::string path = temp_path("best.bin");
  BestModelKeeper keeper("acc", "max", path);
  keeper.update({{"acc", 0.7}}, weights(2), 5);
  const BestModelFile file = BestModelKeeper::load_file(path);
  EXPECT_EQ(file.metric, "acc");
  EXPECT_EQ(file.mode, "max");
  EXPECT_DOUBLE_EQ(file.value, 0.7);
  EXPECT_EQ(file.step, 5);
  EXPECT_EQ(file.state.at("w").to_vector<float>(), std::vector<float>(4, 2.0f));

  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string cut = temp_path("best_cut.bin");
  std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 5));
  try {
    BestModelKeeper::load_file(cut);
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::train
