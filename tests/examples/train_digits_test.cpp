// The digits example, run as a user runs it: as a process, judged by its output
// and exit status.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

namespace {

struct ProcessResult {
  int status = -1;
  std::string output;  // stdout and stderr together
};

ProcessResult run_train_digits(const std::string& args) {
  const std::string command = std::string(TRAIN_DIGITS_BINARY) + " " + args + " 2>&1";
  ProcessResult run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) run.output += buffer;
  const int raw = pclose(pipe);
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return run;
}

double final_accuracy(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("final test accuracy ([0-9.]+)"))) return -1;
  return std::stod(m[1]);
}

}  // namespace

TEST(TrainDigits, LearnsFarAboveChanceInAFewEpochs) {
  // Ten classes: guessing scores 0.1, and an untrained network about as much.
  const ProcessResult run = run_train_digits("--epochs 4");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_GT(final_accuracy(run.output), 0.85) << run.output;
  EXPECT_NE(run.output.find("epoch   4/4"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("samples/s"), std::string::npos);
}

TEST(TrainDigits, ReachesTheIssuesTargetOf95PercentIn30Epochs) {
  const ProcessResult run = run_train_digits("--epochs 30 --require-accuracy 0.95");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_GE(final_accuracy(run.output), 0.95) << run.output;
}

TEST(TrainDigits, AMissingDataFileIsNamedAndExitsNonZero) {
  const ProcessResult run = run_train_digits("--data /nonexistent/digits.csv");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("/nonexistent/digits.csv"), std::string::npos) << run.output;
}

TEST(TrainDigits, AMalformedLineIsReportedWithFileAndLine) {
  const std::string path = testing::TempDir() + "digits_bad.csv";
  {
    std::ofstream out(path);
    for (int i = 0; i < 3; ++i) {
      for (int p = 0; p < 64; ++p) out << (p % 17) << ',';
      out << (i % 10) << '\n';
    }
    out << "1,2,x\n";
  }
  const ProcessResult run = run_train_digits("--data " + path);
  EXPECT_EQ(run.status, 1) << run.output;
  EXPECT_NE(run.output.find(path + ":4:"), std::string::npos) << run.output;
}

TEST(TrainDigits, AnUnknownShardingModeIsNamedWithTheChoicesAndExitsWithStatus2) {
  const ProcessResult run = run_train_digits("--sharding zero3");
  EXPECT_EQ(run.status, 2) << run.output;
  EXPECT_NE(run.output.find("bad value 'zero3' for --sharding: one of ddp, zero1, zero2, fsdp"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("usage:"), std::string::npos) << run.output;
}

TEST(TrainDigits, TrainsInOneProcessInEveryShardingMode) {
  for (const char* mode : {"zero1", "zero2", "fsdp"}) {
    const ProcessResult run = run_train_digits(std::string("--epochs 4 --sharding ") + mode);
    ASSERT_EQ(run.status, 0) << mode << "\n" << run.output;
    EXPECT_GT(final_accuracy(run.output), 0.85) << mode << "\n" << run.output;
  }
}

TEST(TrainDigits, ABadFlagPrintsUsageAndExitsWithStatus2) {
  ProcessResult run = run_train_digits("--epochs many");
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.output.find("usage:"), std::string::npos) << run.output;
  run = run_train_digits("--frobnicate 1");
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.output.find("unknown flag --frobnicate"), std::string::npos) << run.output;
}

std::string parameters_hash(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("parameters hash ([0-9a-f]{16})"))) return "";
  return m[1];
}

TEST(TrainDigits, TheSameSeedGivesBitIdenticalParametersAndAnotherSeedDoesNot) {
  const ProcessResult a = run_train_digits("--epochs 2 --seed 5");
  const ProcessResult b = run_train_digits("--epochs 2 --seed 5");
  const ProcessResult c = run_train_digits("--epochs 2 --seed 6");
  ASSERT_EQ(a.status, 0) << a.output;
  ASSERT_FALSE(parameters_hash(a.output).empty()) << a.output;
  EXPECT_EQ(parameters_hash(a.output), parameters_hash(b.output));
  EXPECT_NE(parameters_hash(a.output), parameters_hash(c.output));
}

TEST(TrainDigits, WritesOneMetricsRecordPerEpochWithStepEpochRateAndWallTime) {
  const std::string path = testing::TempDir() + "digits_metrics.jsonl";
  std::remove(path.c_str());
  const ProcessResult run = run_train_digits("--epochs 3 --metrics " + path);
  ASSERT_EQ(run.status, 0) << run.output;
  std::ifstream in(path);
  std::string line;
  int records = 0;
  const std::regex share("\"(compute|comm_wait|data|checkpoint)_share\": ([0-9.e-]+)");
  while (std::getline(in, line)) {
    ++records;
    EXPECT_TRUE(std::regex_search(line, std::regex("^\\{\"step\": [0-9]+, \"epoch\": " + std::to_string(records) +
                                                   ", \"loss\": [-0-9.e]+, .*\"test_accuracy\": [0-9.e-]+, "
                                                   ".*\"samples_per_s\": [0-9.e+]+, \"wall_s\": [0-9.e-]+\\}$")))
        << line;
    // Where the step time went: four shares that add up to 1.
    double sum = 0;
    int shares = 0;
    for (std::sregex_iterator it(line.begin(), line.end(), share), end; it != end; ++it, ++shares) {
      const double value = std::stod((*it)[2].str());
      EXPECT_TRUE(value >= 0 && value <= 1) << line;
      sum += value;
    }
    EXPECT_EQ(shares, 4) << line;
    EXPECT_NEAR(sum, 1.0, 1e-9) << line;
  }
  EXPECT_EQ(records, 3);
}

TEST(TrainDigits, KeepsTheModelWithTheBestTestAccuracyInTheBestFile) {
  const std::string path = testing::TempDir() + "digits_best.bin";
  std::remove(path.c_str());
  const ProcessResult run = run_train_digits("--epochs 3 --best " + path);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("model saved to " + path), std::string::npos) << run.output;
  std::ifstream in(path, std::ios::binary);
  std::string head(64, '\0');
  in.read(head.data(), 64);
  EXPECT_NE(head.find("troupe-best-model"), std::string::npos) << "the file starts with its magic";
}

// --precision bf16: a bf16 model stepping f32 master weights. The checkpoints keep the
// masters, so 3 epochs + a resume to 6 end exactly where 6 straight epochs do (were
// only the bf16 model saved, the resumed masters would be its rounding, and differ).
TEST(TrainDigits, Bf16MixedPrecisionLearnsAndResumesFromItsCheckpointBitForBit) {
  const std::string dir = testing::TempDir() + "digits_bf16_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const ProcessResult straight = run_train_digits("--epochs 6 --precision bf16");
  ASSERT_EQ(straight.status, 0) << straight.output;
  EXPECT_GT(final_accuracy(straight.output), 0.9) << straight.output;
  const ProcessResult first = run_train_digits("--epochs 3 --precision bf16 --checkpoint-dir " + dir);
  ASSERT_EQ(first.status, 0) << first.output;
  const ProcessResult resumed = run_train_digits("--epochs 6 --precision bf16 --checkpoint-dir " + dir);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
  ASSERT_FALSE(parameters_hash(straight.output).empty()) << straight.output;
  EXPECT_EQ(parameters_hash(resumed.output), parameters_hash(straight.output)) << resumed.output;
  EXPECT_NE(parameters_hash(straight.output), parameters_hash(run_train_digits("--epochs 6").output))
      << "bf16 should not train bit for bit like f32";
  std::filesystem::remove_all(dir);
}

TEST(TrainDigits, ABadPrecisionDeviceOrBackendIsNamedWithTheChoicesAndExitsWithStatus2) {
  ProcessResult run = run_train_digits("--precision fp8");
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.output.find("bad value 'fp8' for --precision: f32 or bf16"), std::string::npos) << run.output;
  run = run_train_digits("--device tpu");
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.output.find("bad value 'tpu' for --device: cpu or cuda"), std::string::npos) << run.output;
  run = run_train_digits("--backend gloo");
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.output.find("bad value 'gloo' for --backend: nccl or mpi"), std::string::npos) << run.output;
  run = run_train_digits("--backend nccl");
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.output.find("--backend nccl needs --device cuda"), std::string::npos) << run.output;
}
