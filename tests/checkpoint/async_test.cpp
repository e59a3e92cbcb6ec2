// Checkpoint::save_async: snapshot now, write in the background, one save at a time.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

#include "test_util.hpp"
#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/snapshot.hpp"
#include "troupe/tensor/cuda_memory.hpp"

namespace troupe::checkpoint {
namespace {

namespace fs = std::filesystem;
using tensor::DType;
using tensor::Tensor;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// A "model" of `mb` MB in 16 tensors whose values training keeps changing.
struct Model {
  explicit Model(std::int64_t mb) {
    for (int i = 0; i < 16; ++i) weights.push_back(Tensor::full({mb * 1024 * 1024 / 4 / 16}, i, DType::f32));
  }
  void register_with(Checkpoint& ckpt) {
    ckpt.register_state("model", {.save =
                                      [this](SectionWriter& w) {
                                        for (std::size_t i = 0; i < weights.size(); ++i)
                                          w.tensor(std::string("w").append(std::to_string(i)), weights[i]);
                                      },
                                  .load =
                                      [this](const SectionReader& r) {
                                        for (std::size_t i = 0; i < weights.size(); ++i)
                                          weights[i].copy_(r.tensor(std::string("w").append(std::to_string(i))));
                                      }});
  }
  std::vector<Tensor> weights;
};

TEST(CheckpointAsync, SavesTheStateAsItWasWhenSaveAsyncReturned) {
  testing::TempDir dir;
  Model model(8);
  Checkpoint ckpt(dir.path(), 3);
  model.register_with(ckpt);
  SaveHandle h = ckpt.save_async(10, 1);
  for (Tensor& w : model.weights) w.fill_(-1);  // training goes on at once
  fs::path file = h.get();
  EXPECT_EQ(file.filename(), "ckpt-000000010.h5");
  EXPECT_TRUE(h.test());

  std::optional<Metadata> meta = ckpt.load_latest();
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->step, 10);
  for (std::size_t i = 0; i < model.weights.size(); ++i)
    EXPECT_EQ(model.weights[i].to_vector<float>()[0], static_cast<float>(i)) << i;
}

TEST(CheckpointAsync, ASaveStartedDuringASaveWaitsForItAndBothLand) {
  testing::TempDir dir;
  Model model(64);
  Checkpoint ckpt(dir.path(), 0);
  model.register_with(ckpt);
  SaveHandle first = ckpt.save_async(1);
  SaveHandle second = ckpt.save_async(2);
  EXPECT_TRUE(first.test()) << "the second save_async returned before the first save was durable";
  EXPECT_EQ(first.get().filename(), "ckpt-000000001.h5");
  EXPECT_EQ(second.get().filename(), "ckpt-000000002.h5");
  ckpt.save(3);  // a synchronous save waits too
  EXPECT_EQ(ckpt.directory().list().size(), 3u);
}

TEST(CheckpointAsync, WithIfBusySkipASaveDuringASaveIsSkippedAndTimeoutsAreHonoured) {
  testing::TempDir dir;
  Model model(256);  // long enough to write that the next call lands while it does
  Checkpoint ckpt(dir.path(), 0);
  model.register_with(ckpt);
  SaveHandle first = ckpt.save_async(1);
  EXPECT_THROW(first.wait(std::chrono::milliseconds(0)), TimeoutError);
  SaveHandle second = ckpt.save_async(2, 0, {.if_busy = IfBusy::skip});
  EXPECT_TRUE(second.skipped());
  EXPECT_TRUE(second.test());
  EXPECT_THROW(second.get(), InvalidArgument);
  first.wait(std::chrono::milliseconds(60000));
  std::vector<fs::path> files = ckpt.directory().list();
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename(), "ckpt-000000001.h5");
}

TEST(CheckpointAsync, DestroyingTheCheckpointWaitsForADroppedHandlesSave) {
  testing::TempDir dir;
  Model model(32);
  {
    Checkpoint ckpt(dir.path(), 3);
    model.register_with(ckpt);
    ckpt.save_async(5);  // handle dropped
  }
  FileReader file((dir / "ckpt-000000005.h5").string());
  EXPECT_NO_THROW(file.verify_all());
}

// Issue 25: a GPU tensor's snapshot lands in page-locked memory (the device copies by
// DMA, not through a bounce buffer), and the next snapshot copies into the same buffer.
TEST(CheckpointAsync, SnapshotsOfGpuTensorsArePinnedAndReused) {
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  Tensor weight = Tensor::full({1 << 16}, 3.0, DType::f32).to(tensor::Device::cuda());
  Snapshot first;
  first.write_tensor("/model/w", weight);
  std::vector<Tensor> spare = first.release_buffers();
  ASSERT_EQ(spare.size(), 1u);
  EXPECT_TRUE(tensor::is_pinned(spare[0]));
  const void* buffer = spare[0].raw_data();
  weight.fill_(5.0);
  Snapshot second(std::move(spare));
  second.write_tensor("/model/w", weight);
  std::vector<Tensor> again = second.release_buffers();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].raw_data(), buffer);
  EXPECT_EQ(again[0].to_vector<float>()[123], 5.0f);
}

// Large host tensors are copied at finish(), split over threads across tensor
// boundaries: every byte lands where it belongs (odd sizes, a small tensor between,
// a spare buffer reused), the originals may be dropped before finish() and changed
// after it, and the copies into a spare buffer keep their values.
TEST(CheckpointAsync, BatchedSnapshotCopiesHoldTheValuesAtFinish) {
  const auto ramp = [](std::int64_t n, float from) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = from + static_cast<float>(i);
    return Tensor::from_vector(v, {n});
  };
  Tensor big = ramp((3 << 18) + 7, 0.0F);  // 3 MB and 28 bytes
  const std::vector<float> big_then = big.to_vector<float>();
  Snapshot first;
  first.write_tensor("/model/big", big);
  first.write_tensor("/model/small", ramp(5, 100.0F));
  first.write_tensor("/model/dropped", ramp((1 << 18) + 3, 7.0F));  // its only handle is the snapshot's
  first.finish();
  big.fill_(-1.0);
  std::vector<Tensor> spare = first.release_buffers();
  ASSERT_EQ(spare.size(), 3U);
  EXPECT_EQ(spare[0].to_vector<float>(), big_then);
  EXPECT_EQ(spare[1].to_vector<float>(), ramp(5, 100.0F).to_vector<float>());
  EXPECT_EQ(spare[2].to_vector<float>(), ramp((1 << 18) + 3, 7.0F).to_vector<float>());

  const void* buffer = spare[0].raw_data();
  Snapshot second(std::move(spare));
  second.write_tensor("/model/big", big);
  second.finish();
  big.fill_(2.0);
  const std::vector<Tensor> again = second.release_buffers();
  ASSERT_EQ(again.size(), 1U);
  EXPECT_EQ(again[0].raw_data(), buffer);
  EXPECT_EQ(again[0].to_vector<float>(), std::vector<float>(big_then.size(), -1.0F));
}

// Told by the order of events, not by timing (a ratio of two wall-clock times fails on
// a loaded machine): the writer is held after its first tensor, and save_async must
// have returned by then, with a copy the training may overwrite.
TEST(CheckpointAsync, TheStallIsTheSnapshotNotTheWrite) {
  testing::TempDir dir;
  Model model(128);
  Checkpoint ckpt(dir.path(), 2);
  model.register_with(ckpt);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> held{0};
  ckpt.set_write_observer([&](std::int64_t step, std::string_view) {
    // Bounded: were the write made inside save_async, this would be its thread.
    if (step == 3 && held.fetch_add(1) == 0) released.wait_for(std::chrono::seconds(30));
  });
  auto t0 = Clock::now();
  ckpt.save(1);
  double sync_ms = ms_since(t0);
  t0 = Clock::now();
  ckpt.save_async(2).get();  // first async save: fresh buffers
  double first_ms = ms_since(t0);
  t0 = Clock::now();
  SaveHandle h = ckpt.save_async(3);  // reuses the buffers of the one before
  double stall_ms = ms_since(t0);
  // Returned while the write cannot finish: the writer is (or will be) held.
  EXPECT_FALSE(fs::exists(dir / "ckpt-000000003.h5"));
  for (auto& w : model.weights) w.fill_(-1.0);  // training goes on
  release.set_value();
  h.get();
  EXPECT_GE(held.load(), 16);  // every tensor went through the held writer
  std::cout << "[          ] 128 MB: synchronous save " << sync_ms << " ms, first async save " << first_ms
            << " ms, async stall with recycled buffers " << stall_ms << " ms (" << 100 * stall_ms / sync_ms
            << "% of synchronous)\n";
  FileReader file((dir / "ckpt-000000003.h5").string());
  EXPECT_NO_THROW(file.verify_all());
  for (int i = 0; i < 16; ++i)  // the values at save_async, not the ones written after it
    EXPECT_EQ(file.read("/model/w" + std::to_string(i)).to_vector<float>()[7], static_cast<float>(i));
}

}  // namespace
}  // namespace troupe::checkpoint
