// The saving process's peak memory stays bounded by the largest tensor plus a fixed
// buffer when tensors are handed over one at a time, whatever the total size. Measured
// in a fresh child process with Linux's peak-RSS counter (VmHWM, reset through
// /proc/self/clear_refs), once for a streaming source and once, as the control that
// shows the measurement can fail, for a source that holds the whole state.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "test_util.hpp"
#include "troupe/checkpoint/checkpoint.hpp"

namespace troupe::checkpoint {
namespace {

using tensor::DType;
using tensor::Tensor;

constexpr std::int64_t kMiB = 1 << 20;
constexpr int kHeldTensors = 48;
constexpr std::int64_t kTensorBytes = 8 * kMiB;   // 384 MB in all
constexpr std::int64_t kFixedBuffer = 64 * kMiB;  // the allowance

std::int64_t status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size()));
  return -1;
}

enum class Source {
  scratch,  // builds each tensor in the writer's reusable buffer (an assembling actor)
  live,     // hands over tensors that already exist (a model's state_dict)
  hold,     // control: allocates every tensor and keeps them all
};

// Runs one save in a child; returns its peak RSS growth in bytes.
std::int64_t peak_growth_of_save(const std::filesystem::path& folder, Source source) {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  pid_t child = fork();
  if (child == 0) {
    close(out[0]);
    Checkpoint ckpt(folder, 1);
    std::vector<Tensor> held;
    if (source == Source::live)
      for (int i = 0; i < kHeldTensors; ++i) held.push_back(Tensor::full({kTensorBytes / 4}, i, DType::f32));
    ckpt.register_state("model", {.save =
                                      [&](SectionWriter& w) {
                                        for (int i = 0; i < kHeldTensors; ++i) {
                                          std::string name = "layers." + std::to_string(i) + ".weight";
                                          if (source == Source::scratch) {
                                            w.tensor(name, w.scratch({kTensorBytes / 4}, DType::f32).fill_(i));
                                          } else if (source == Source::live) {
                                            w.tensor(name, held[i]);
                                          } else {
                                            held.push_back(Tensor::full({kTensorBytes / 4}, i, DType::f32));
                                            w.tensor(name, held.back());
                                          }
                                        }
                                      },
                                  .load = [](const SectionReader&) {}});
    { std::ofstream("/proc/self/clear_refs") << "5"; }  // peak := current
    std::int64_t before = status_kib("VmRSS:");
    ckpt.save(1);
    std::int64_t growth = (status_kib("VmHWM:") - before) * 1024;
    if (write(out[1], &growth, sizeof growth) != sizeof growth) _exit(2);
    _exit(0);
  }
  close(out[1]);
  std::int64_t growth = -1;
  EXPECT_EQ(read(out[0], &growth, sizeof growth), static_cast<ssize_t>(sizeof growth));
  close(out[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return growth;
}

TEST(CheckpointMemory, StreamingSaveOfAStateFiveTimesTheBoundStaysWithinIt) {
  testing::TempDir dir;
  const std::int64_t total = kHeldTensors * kTensorBytes;
  const std::int64_t bound = kTensorBytes + kFixedBuffer;
  ASSERT_GE(total, 5 * bound);
  std::int64_t streaming = peak_growth_of_save(dir / "stream", Source::scratch);
  std::int64_t live = peak_growth_of_save(dir / "live", Source::live);
  std::int64_t holding = peak_growth_of_save(dir / "hold", Source::hold);
  std::cout << "[          ] peak RSS growth saving " << total / kMiB << " MB: built one at a time " << streaming / kMiB
            << " MB (bound " << bound / kMiB << " MB), already live " << live / kMiB
            << " MB, control holding every tensor " << holding / kMiB << " MB\n";
  EXPECT_GE(streaming, 0);
  EXPECT_LE(streaming, bound);
  EXPECT_LE(live, kFixedBuffer) << "saving live tensors copies none of them";
  EXPECT_GE(holding, total * 9 / 10) << "the measurement sees memory that is really held";
}

}  // namespace
}  // namespace troupe::checkpoint
