// Damage anywhere in a checkpoint file -- data, HDF5 metadata, attributes -- must end in
// one of two outcomes: the file reads back bit for bit (the byte was slack space), or a
// FormatError/CheckpointError. Never different data, never a crash: each trial runs in a
// child process so a crash inside HDF5 would show as a signal, not kill the test binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>

#include "test_util.hpp"
#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/file_writer.hpp"

namespace troupe::checkpoint {
namespace {

using tensor::DType;
using tensor::Tensor;

enum Outcome { kIdentical = 0, kRejected = 1, kWrongData = 2, kOtherError = 3 };

int load_and_compare(const std::string& path, const std::vector<Tensor>& expected) {
  try {
    FileReader file(path);
    file.verify_all();
    if (file.attributes("/").get_int("step") != 12) return kWrongData;
    std::vector<TensorInfo> listed = file.tensors("/model");
    if (listed.size() != expected.size()) return kWrongData;
    for (std::size_t i = 0; i < expected.size(); ++i)
      if (!testing::same_bits(file.read(listed[i].path), expected[i])) return kWrongData;
    return kIdentical;
  } catch (const Error&) {
    return kRejected;
  } catch (...) {
    return kOtherError;
  }
}

TEST(CheckpointCorruption, AFlippedByteAnywhereIsCaughtOrHarmlessNeverWrongDataOrACrash) {
  testing::TempDir dir;
  std::vector<Tensor> tensors;
  for (int i = 0; i < 6; ++i)
    tensors.push_back(testing::random_tensor({17 + 50 * i, 3}, i % 2 ? DType::bf16 : DType::f32, i));
  {
    FileWriter out((dir / "good.h5").string());
    out.set_attribute("/", "step", std::int64_t{12});
    for (std::size_t i = 0; i < tensors.size(); ++i) out.write_tensor("/model/t" + std::to_string(i), tensors[i]);
    out.close();
  }
  const std::vector<char> good = testing::read_bytes(dir / "good.h5");
  std::mt19937 gen(2026);
  int counts[4] = {0, 0, 0, 0}, crashed = 0;
  constexpr int kTrials = 150;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::vector<char> bad = good;
    std::size_t at = std::uniform_int_distribution<std::size_t>(0, bad.size() - 1)(gen);
    bad[at] ^= static_cast<char>(1 << std::uniform_int_distribution<int>(0, 7)(gen));
    std::string path = (dir / "bad.h5").string();
    testing::write_bytes(path, bad);
    pid_t child = fork();
    if (child == 0) _exit(load_and_compare(path, tensors));
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status)) {
      int outcome = WEXITSTATUS(status);
      ++counts[outcome < 4 ? outcome : kOtherError];
      EXPECT_NE(outcome, kWrongData) << "flipping a bit of byte " << at << " gave different data without an error";
    } else {
      ++crashed;
      ADD_FAILURE() << "flipping a bit of byte " << at << " of " << bad.size() << " crashed the reader (signal "
                    << WTERMSIG(status) << ")";
    }
  }
  std::cout << "[          ] " << kTrials << " single-bit flips in a " << good.size()
            << "-byte file: " << counts[kRejected] << " rejected, " << counts[kIdentical] << " harmless, "
            << counts[kWrongData] << " wrong data, " << counts[kOtherError] << " other errors, " << crashed
            << " crashes\n";
  EXPECT_EQ(counts[kOtherError], 0);
}

}  // namespace
}  // namespace troupe::checkpoint
