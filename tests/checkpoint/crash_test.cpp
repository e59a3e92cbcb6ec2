// kill -9 in the middle of a save: the previous checkpoint must stay loadable, the debris
// must be ignored by readers and removed by the next save.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "test_util.hpp"
#include "troupe/checkpoint/checkpoint.hpp"

namespace troupe::checkpoint {
namespace {

namespace fs = std::filesystem;
using tensor::DType;
using tensor::Tensor;

constexpr int kTensors = 16;
const tensor::Shape kShape{256, 1024};  // 1 MB of f32 each

Tensor state_tensor(std::int64_t step, int i) {
  return testing::random_tensor(kShape, DType::f32, static_cast<std::uint32_t>(step * 1000 + i));
}

// Registers a model section whose save reports each written tensor on `progress` and,
// when `go` is open, waits for a byte from it before writing the next one.
void register_model(Checkpoint& ckpt, std::int64_t& step, int progress = -1, int go = -1) {
  ckpt.register_state("model", {.save =
                                    [&step, progress, go](SectionWriter& w) {
                                      for (int i = 0; i < kTensors; ++i) {
                                        if (go >= 0) {
                                          char c;
                                          if (read(go, &c, 1) != 1) _exit(3);
                                        }
                                        w.tensor(std::string("t").append(std::to_string(i)), state_tensor(step, i));
                                        if (progress >= 0 && write(progress, "x", 1) != 1) _exit(4);
                                      }
                                    },
                                .load =
                                    [](const SectionReader& r) {
                                      // checked by the caller through the file, see below
                                      (void)r;
                                    }});
}

// Loads the latest checkpoint and checks that every tensor is the one of its step.
std::int64_t expect_loadable(const fs::path& folder) {
  Checkpoint ckpt(folder, 2);
  std::vector<std::string> warnings;
  ckpt.set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  std::int64_t loaded_step = -1;
  std::vector<Tensor> loaded;
  ckpt.register_state("model", {.save = [](SectionWriter&) {},
                                .load =
                                    [&](const SectionReader& r) {
                                      for (int i = 0; i < kTensors; ++i)
                                        loaded.push_back(r.tensor(std::string("t").append(std::to_string(i))));
                                    }});
  std::optional<Metadata> meta = ckpt.load_latest();
  EXPECT_TRUE(meta);
  if (!meta) return -1;
  for (const std::string& w : warnings)  // the only warning allowed: the killed save's debris
    EXPECT_NE(w.find("ignoring unfinished checkpoint"), std::string::npos) << w;
  loaded_step = meta->step;
  EXPECT_EQ(loaded.size(), static_cast<std::size_t>(kTensors));
  for (int i = 0; i < kTensors && i < static_cast<int>(loaded.size()); ++i)
    EXPECT_TRUE(testing::same_bits(loaded[i], state_tensor(loaded_step, i))) << "step " << loaded_step << " t" << i;
  return loaded_step;
}

void save_step_one(const fs::path& folder) {
  std::int64_t step = 1;
  Checkpoint ckpt(folder, 2);
  register_model(ckpt, step);
  ckpt.save(step);
}

pid_t reap(pid_t child) {
  int status = 0;
  return waitpid(child, &status, 0);
}

TEST(CheckpointCrash, KillNineBetweenTensorsLeavesThePreviousCheckpoint) {
  testing::TempDir dir;
  save_step_one(dir.path());
  for (int point : {0, 1, kTensors / 2, kTensors}) {
    int progress[2], go[2];
    ASSERT_EQ(pipe(progress), 0);
    ASSERT_EQ(pipe(go), 0);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(progress[0]);
      close(go[1]);
      std::int64_t step = 2;
      Checkpoint ckpt(dir.path(), 2);
      register_model(ckpt, step, progress[1], go[0]);
      ckpt.save(step);
      _exit(0);
    }
    close(progress[1]);
    close(go[0]);
    // Let `point` tensors be written; the child then waits for the next go (or, at
    // kTensors, is past the last tensor and about to close the file).
    for (int i = 0; i < point; ++i) {
      char c;
      ASSERT_EQ(write(go[1], "g", 1), 1);
      ASSERT_EQ(read(progress[0], &c, 1), 1);
    }
    kill(child, SIGKILL);
    ASSERT_EQ(reap(child), child);
    close(progress[0]);
    close(go[1]);
    EXPECT_EQ(expect_loadable(dir.path()), 1) << "killed after " << point << " tensors";
  }
  // The killed writers left temporary files; the next save removes them.
  std::int64_t step = 3;
  Checkpoint ckpt(dir.path(), 2);
  register_model(ckpt, step);
  ckpt.save(step);
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  EXPECT_EQ(expect_loadable(dir.path()), 3);
}

TEST(CheckpointCrash, KillNineAtRandomMomentsNeverLosesACheckpoint) {
  testing::TempDir dir;
  save_step_one(dir.path());
  // How long a whole save takes here, so the kills spread over all of it (commit included).
  auto t0 = std::chrono::steady_clock::now();
  save_step_one(dir / "timing");
  auto save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  std::mt19937 gen(12345);
  int completed = 0;
  constexpr int kTrials = 20;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::int64_t step = 2 + trial;
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      Checkpoint ckpt(dir.path(), 2);
      register_model(ckpt, step);
      ckpt.save(step);
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<long>(0, save_us * 2)(gen)));
    kill(child, SIGKILL);
    ASSERT_EQ(reap(child), child);
    std::int64_t loaded = expect_loadable(dir.path());
    EXPECT_GE(loaded, 1) << "trial " << trial;
    if (loaded == step) ++completed;
  }
  std::cout << "[          ] " << completed << " of " << kTrials << " killed saves had completed; "
            << "a whole save takes " << save_us << " us\n";
}

// A writer killed with SIGKILL and not yet reaped by its parent (a zombie, as under a
// torn-down mpirun before init reaps it) is gone too: its file is debris at once.
TEST(CheckpointCrash, AKilledWriterNotYetReapedLeavesDebris) {
  testing::TempDir dir;
  save_step_one(dir.path());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    CheckpointDirectory mine(dir.path());
    std::ofstream(mine.temp_path(2)) << "half a file";
    kill(getpid(), SIGKILL);
    _exit(5);
  }
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);  // dead, not reaped
  CheckpointDirectory folder(dir.path());
  ASSERT_EQ(folder.debris().size(), 1u);
  const std::string name = folder.debris()[0].filename().string();  // .ckpt-...tmp-<host>-<pid>
  EXPECT_EQ(name.rfind(".ckpt-000000002.h5.tmp-", 0), 0u) << name;
  EXPECT_TRUE(name.ends_with("-" + std::to_string(child))) << name;
  Checkpoint ckpt(dir.path(), 2);
  std::vector<std::string> warnings;
  ckpt.set_warning_handler([&](const std::string& w) { warnings.push_back(w); });
  ckpt.register_state("model", {.save = [](SectionWriter&) {}, .load = [](const SectionReader&) {}});
  ASSERT_TRUE(ckpt.load_latest());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ignoring unfinished checkpoint"), std::string::npos) << warnings[0];
  EXPECT_EQ(folder.remove_debris(), 1u);
  ASSERT_EQ(reap(child), child);
}

// A commit renames the checkpoints past keep_last aside and deletes them on a thread. A
// process that ends before the deletion leaves a set-aside file: never listed, loaded
// or warned about, and deleted by the next save, this host's or another's.
TEST(CheckpointCrash, CheckpointsSetAsideByAGoneProcessGoAtTheNextSave) {
  testing::TempDir dir;
  save_step_one(dir.path());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(reap(child), child);
  // This host's name as the folder writes it: .ckpt-000000009.h5.tmp-<host>-<pid>.
  const std::string temp = CheckpointDirectory(dir.path()).temp_path(9).filename().string();
  const std::size_t from = temp.find(".tmp-") + 5;
  const std::string host = temp.substr(from, temp.rfind('-') - from);
  const fs::path here = dir / (".ckpt-000000000.h5.going-" + host + "-" + std::to_string(child));
  const fs::path elsewhere = dir / ".ckpt-000000001.h5.going-another-host-77";
  testing::write_bytes(here, std::vector<char>(5000, 'z'));
  testing::write_bytes(elsewhere, std::vector<char>(5000, 'z'));

  CheckpointDirectory folder(dir.path());
  EXPECT_EQ(folder.list().size(), 1u);
  EXPECT_TRUE(folder.debris().empty());
  EXPECT_EQ(expect_loadable(dir.path()), 1);

  std::int64_t step = 2;
  {
    Checkpoint ckpt(dir.path(), 1);
    register_model(ckpt, step);
    ckpt.save(step);  // step 1 goes on a thread; the leftovers before save() returns
    EXPECT_FALSE(fs::exists(here));
    EXPECT_FALSE(fs::exists(elsewhere));
    ASSERT_EQ(ckpt.directory().list().size(), 1u);
    EXPECT_EQ(ckpt.directory().list()[0].filename(), "ckpt-000000002.h5");
  }  // the destructor waits for the deletion
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt-000000002.h5", "latest"}));
}

}  // namespace
}  // namespace troupe::checkpoint
