// The worker group's checkpoint in the sharded modes (TrainingCheckpoint over a
// ShardedModel): the parallel save, with nothing gathered. Its file must be the one the
// gathered save writes -- same groups, tensor names, dtypes, checksums and attributes --
// and load into a plain (DDP) model at another world size with identical tensors; and
// on a model of 100 MB of parameters no rank's peak RSS may grow during the save by
// more than its own pieces + the largest tensor + 64 MB (issue 10, "Checkpoints").
// Run under mpirun at 2 and 4 ranks (tests/train/CMakeLists.txt).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "train_world.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/state_groups.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/sharded_model.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/distributed_sampler.hpp"
#include "troupe/train/training_checkpoint.hpp"
#include "troupe/train/training_state.hpp"

namespace troupe::train {
namespace {

namespace fs = std::filesystem;
using testing::world;

constexpr std::int64_t kMicroBatch = 4;
constexpr std::int64_t kMicroPerEpoch = 6;

std::unique_ptr<nn::Optimizer> adamw(std::vector<nn::NamedParameter> params) {
  return std::make_unique<nn::AdamW>(std::move(params), 0.01);
}

// A folder every rank names the same (rank 0's pid), removed at the end.
struct SharedFolder {
  fs::path path;
  explicit SharedFolder(const std::string& name) {
    std::int64_t pid = world().rank() == 0 ? static_cast<std::int64_t>(getpid()) : 0;
    if (world().size() > 1) world().allreduce(collectives::Buffer(&pid, 1), collectives::ReduceOp::max);
    path = fs::temp_directory_path() / ("troupe_" + name + "_" + std::to_string(pid));
  }
  ~SharedFolder() {
    world().barrier();
    if (world().rank() == 0) fs::remove_all(path);
  }
};

// What the gathered save did: rank 0 writes `groups` through a Checkpoint.
struct GatheredSource {
  StateGroups groups;
  StateGroups state_dicts() const { return groups; }
  void load_state_dicts(const StateGroups&) {}
};

fs::path gathered_save(const fs::path& folder, const StateGroups& groups, std::int64_t step, std::int64_t epoch) {
  checkpoint::Checkpoint ckpt(folder, 1);
  ckpt.set_run_info({.run_id = "sharded-checkpoint-test", .world_size = world().size()});
  GatheredSource source{groups};
  checkpoint::register_state_groups(ckpt, source);
  return ckpt.save(step, epoch);
}

std::string names(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + " ";
  return out;
}

// Every group, dataset (name, order, dtype, shape, checksum, bytes) and attribute of
// the two files is the same; only the creation time may differ.
void expect_same_file(const fs::path& a, const fs::path& b) {
  checkpoint::FileReader x(a.string()), y(b.string());
  const auto same_attributes = [&](const std::string& group) {
    const checkpoint::Attributes ax = x.attributes(group), ay = y.attributes(group);
    EXPECT_EQ(ax.size(), ay.size()) << group;
    for (const auto& [name, value] : ax) {
      if (group == "/" && name == "created_utc") continue;
      const checkpoint::AttrValue* other = ay.find(name);
      ASSERT_NE(other, nullptr) << group << " attribute " << name;
      EXPECT_EQ(checkpoint::to_string(value), checkpoint::to_string(*other)) << group << " attribute " << name;
    }
  };
  same_attributes("/");
  ASSERT_EQ(names(x.child_groups("/")), names(y.child_groups("/")));
  for (const std::string& child : x.child_groups("/")) {
    const std::string group = "/" + child;
    same_attributes(group);
    const auto tx = x.tensors(group), ty = y.tensors(group);
    ASSERT_EQ(tx.size(), ty.size()) << group;
    for (std::size_t i = 0; i < tx.size(); ++i) {
      ASSERT_EQ(tx[i].path, ty[i].path) << group << " tensor " << i;
      EXPECT_EQ(tx[i].dtype, ty[i].dtype) << tx[i].path;
      EXPECT_EQ(tx[i].shape, ty[i].shape) << tx[i].path;
      EXPECT_EQ(tx[i].checksum, ty[i].checksum) << tx[i].path;
      const tensor::Tensor vx = x.read(tx[i].path), vy = y.read(ty[i].path);
      ASSERT_EQ(vx.nbytes(), vy.nbytes()) << tx[i].path;
      EXPECT_EQ(std::memcmp(vx.raw_data(), vy.raw_data(), vx.nbytes()), 0) << tx[i].path;
    }
  }
}

void expect_same_dict(const nn::StateDict& got, const nn::StateDict& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  auto g = got.begin();
  for (const auto& [key, value] : want) {
    const auto& [got_key, got_value] = *g++;
    ASSERT_EQ(got_key, key) << what;
    ASSERT_EQ(got_value.dtype(), value.dtype()) << what << " " << key;
    ASSERT_EQ(got_value.shape(), value.shape()) << what << " " << key;
    EXPECT_EQ(std::memcmp(got_value.raw_data(), value.raw_data(), value.nbytes()), 0) << what << " " << key;
  }
}

const nn::StateDict& group_of(const StateGroups& groups, const std::string& name) {
  for (const auto& [key, dict] : groups)
    if (key == name) return dict;
  throw std::runtime_error("no group " + name);
}

// One sharded run of the small MLP with AdamW, trained to an epoch's end.
struct ShardedRun {
  std::unique_ptr<nn::Sequential> model = testing::make_mlp(5);
  TensorDataset data = testing::make_data(kMicroBatch * kMicroPerEpoch * world().size(), 9);
  std::unique_ptr<parallel::ShardedModel> sharded;
  DistributedSampler sampler{data.size(), world().size(), world().rank(), SamplerOptions{.seed = 3}};
  std::unique_ptr<TrainingState> state;
  nn::CrossEntropyLoss loss_fn;

  explicit ShardedRun(parallel::Sharding mode) {
    sharded = std::make_unique<parallel::ShardedModel>(mode, *model, world(), adamw, std::size_t{2000});
    state = std::make_unique<TrainingState>(*model, sharded->optimizer(), sampler, *sharded);
  }
  void train_epoch() {
    while (!sampler.exhausted()) {
      const TensorBatch batch = data.rows(sampler.take(kMicroBatch));
      loss_fn.forward(sharded->forward(batch.inputs), batch.targets);
      auto r = sharded->optimizer_step_with_gradient_accumulation([&](double s) { return loss_fn.backward(s); }, 2,
                                                                  kMicroPerEpoch);
      state->step += r.stepped;
    }
  }
};

// The parallel save of each sharded mode writes the gathered save's file, and a
// one-rank plain model (DDP's layout, another world size) resumes from it exactly.
void check_mode(parallel::Sharding mode) {
  ShardedRun run(mode);
  run.train_epoch();
  const StateGroups gathered = clone(run.state->state_dicts());  // the old path, for reference
  SharedFolder parallel_dir(std::string("sharded_ckpt_") + parallel::sharding_name(mode));
  SharedFolder gathered_dir(std::string("gathered_ckpt_") + parallel::sharding_name(mode));
  fs::path file;
  {
    TrainingCheckpoint ckpt(parallel_dir.path, *run.state,
                            {.run_id = "sharded-checkpoint-test", .world_size = world().size()}, world().rank() == 0);
    ASSERT_TRUE(ckpt.parallel());
    checkpoint::SaveHandle handle = ckpt.save(run.state->step, run.state->epoch);
    file = handle.get();  // asynchronous: committed on every rank once the handle is ready
    EXPECT_TRUE(handle.test());
    ckpt.wait();
  }
  EXPECT_TRUE(fs::exists(file));
  if (world().rank() == 0) {
    const fs::path reference = gathered_save(gathered_dir.path, gathered, run.state->step, run.state->epoch);
    expect_same_file(file, reference);

    // DDP's layout at world size 1: a plain model and optimizer resume from the file.
    auto model = testing::make_mlp(77);  // other initial values, overwritten by the load
    nn::AdamW optimizer(model->named_parameters(), 0.5);
    DistributedSampler sampler(run.data.size(), 1, 0, SamplerOptions{.seed = 3});
    TrainingState state(*model, optimizer, sampler);
    TrainingCheckpoint plain(parallel_dir.path, state, {.run_id = "resumed", .world_size = 1}, true);
    EXPECT_FALSE(plain.parallel());
    const auto meta = plain.resume();
    ASSERT_TRUE(meta.has_value());
    EXPECT_EQ(meta->path, file);
    EXPECT_EQ(state.step, run.state->step);
    EXPECT_EQ(state.epoch, run.state->epoch);
    expect_same_dict(model->state_dict(), group_of(gathered, "model"), "model");
    expect_same_dict(optimizer.state_dict(), group_of(gathered, "optimizer"), "optimizer");
  }
  world().barrier();
}

TEST(ShardedCheckpoint, FsdpParallelSaveWritesTheGatheredFileAndLoadsIntoAPlainModel) {
  check_mode(parallel::Sharding::fsdp);
}
TEST(ShardedCheckpoint, Zero1ParallelSaveWritesTheGatheredFileAndLoadsIntoAPlainModel) {
  check_mode(parallel::Sharding::zero1);
}
TEST(ShardedCheckpoint, Zero2ParallelSaveWritesTheGatheredFileAndLoadsIntoAPlainModel) {
  check_mode(parallel::Sharding::zero2);
}

// The save resumes in the sharded mode itself, at the same world size, bit for bit
// (zero2 and fsdp: the sharded resume, each rank reading only its slices).
void check_resume(parallel::Sharding mode) {
  ShardedRun run(mode);
  run.train_epoch();
  SharedFolder dir("sharded_ckpt_resume");
  TrainingCheckpoint ckpt(dir.path, *run.state, {.run_id = "r", .world_size = world().size()}, world().rank() == 0);
  ckpt.save(run.state->step, run.state->epoch);
  const StateGroups saved = clone(run.state->state_dicts());
  run.sampler.set_epoch(++run.state->epoch);
  run.train_epoch();  // moves on; the resume must bring it back
  ASSERT_TRUE(ckpt.resume().has_value());
  const StateGroups restored = run.state->state_dicts();
  for (const char* group : {"model", "optimizer", "sampler", "status"})
    expect_same_dict(group_of(restored, group), group_of(saved, group), group);
}

TEST(ShardedCheckpoint, FsdpResumesFromItsParallelSave) { check_resume(parallel::Sharding::fsdp); }
TEST(ShardedCheckpoint, Zero2ResumesFromItsParallelSave) { check_resume(parallel::Sharding::zero2); }
TEST(ShardedCheckpoint, Zero1ResumesFromItsParallelSave) { check_resume(parallel::Sharding::zero1); }

// A file another mode wrote at another world size (the gathered save: one writer, DDP's
// layout) resumes a fresh sharded run, each rank reading its slices of it.
TEST(ShardedCheckpoint, AShardedResumeReadsAFileOfAnotherModeAndWorldSize) {
  ShardedRun run(parallel::Sharding::fsdp);
  run.train_epoch();
  const StateGroups gathered = clone(run.state->state_dicts());
  SharedFolder dir("sharded_ckpt_foreign");
  if (world().rank() == 0) gathered_save(dir.path, gathered, run.state->step, run.state->epoch);
  world().barrier();
  for (parallel::Sharding mode : {parallel::Sharding::fsdp, parallel::Sharding::zero2, parallel::Sharding::zero1}) {
    ShardedRun fresh(mode);
    TrainingCheckpoint ckpt(dir.path, *fresh.state, {.run_id = "foreign", .world_size = world().size()},
                            world().rank() == 0);
    ASSERT_TRUE(ckpt.resume().has_value()) << parallel::sharding_name(mode);
    const StateGroups restored = fresh.state->state_dicts();
    for (const char* group : {"model", "optimizer", "status"})
      expect_same_dict(group_of(restored, group), group_of(gathered, group),
                       std::string(parallel::sharding_name(mode)) + " " + group);
  }
}

// A damaged tensor in the newest file is found by whichever rank verifies its share,
// and every rank skips the file together and resumes from the one before.
TEST(ShardedCheckpoint, ADamagedNewestFileIsSkippedByEveryRank) {
  ShardedRun run(parallel::Sharding::fsdp);
  run.train_epoch();
  SharedFolder dir("sharded_ckpt_damaged");
  const StateGroups first = clone(run.state->state_dicts());
  fs::path newest;
  {
    TrainingCheckpoint ckpt(dir.path, *run.state, {.run_id = "d", .world_size = world().size()}, world().rank() == 0);
    ckpt.save(run.state->step, run.state->epoch);
    run.sampler.set_epoch(++run.state->epoch);
    run.train_epoch();
    newest = ckpt.save(run.state->step, run.state->epoch).get();
  }
  const StateGroups second = clone(run.state->state_dicts());
  if (world().rank() == 0) {  // flip one byte inside the largest optimizer tensor
    const nn::StateDict& optimizer = group_of(second, "optimizer");
    Tensor last;
    for (const auto& [key, value] : optimizer)
      if (!last.defined() || value.nbytes() > last.nbytes()) last = value;
    EXPECT_GE(last.nbytes(), 64u);
    std::ifstream in(newest, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const char* needle = static_cast<const char*>(last.raw_data());
    auto at = std::search(bytes.begin(), bytes.end(), needle, needle + 64);
    EXPECT_NE(at, bytes.end());
    if (at != bytes.end()) at[8] ^= 0x10;
    std::ofstream(newest, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  world().barrier();
  ShardedRun fresh(parallel::Sharding::fsdp);
  TrainingCheckpoint ckpt(dir.path, *fresh.state, {.run_id = "d", .world_size = world().size()}, world().rank() == 0);
  const auto meta = ckpt.resume();
  ASSERT_TRUE(meta.has_value());
  EXPECT_NE(meta->path, newest);
  const StateGroups restored = fresh.state->state_dicts();
  for (const char* group : {"model", "optimizer", "status"})
    expect_same_dict(group_of(restored, group), group_of(first, group), group);
}

// A file whose model does not fit (another architecture) is refused on every rank,
// naming the file and the tensor; nothing is loaded.
TEST(ShardedCheckpoint, AShardedResumeOfAnotherModelNamesTheFileAndTensor) {
  ShardedRun run(parallel::Sharding::fsdp);
  run.train_epoch();
  SharedFolder dir("sharded_ckpt_other_model");
  {
    TrainingCheckpoint ckpt(dir.path, *run.state, {.run_id = "o", .world_size = world().size()}, world().rank() == 0);
    ckpt.save(run.state->step, run.state->epoch);
  }
  tensor::Generator gen(4);
  auto other = std::make_unique<nn::Sequential>();
  other->emplace<nn::Linear>(16, 9, gen);
  DistributedSampler sampler(run.data.size(), world().size(), world().rank(), SamplerOptions{.seed = 3});
  parallel::ShardedModel sharded(parallel::Sharding::fsdp, *other, world(), adamw, std::size_t{2000});
  TrainingState state(*other, sharded.optimizer(), sampler, sharded);
  TrainingCheckpoint ckpt(dir.path, state, {.run_id = "o", .world_size = world().size()}, world().rank() == 0);
  try {
    ckpt.resume();
    ADD_FAILURE() << "a file of another model resumed";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(".h5:/model"), std::string::npos) << what;
    EXPECT_NE(what.find("'0.weight' is f32"), std::string::npos) << what;
  }
}

// Issue 25's resume bound, from the host allocator's counters: a sharded run built on
// the meta device and resumed holds at its peak no more than 1.2x its steady-state
// model state (16N/W with AdamW) + one unit. The old path (every rank loading the full
// model and optimizer groups) held 12N on top of its shards.
TEST(ShardedCheckpoint, AShardedResumePeaksBelowItsSteadyStatePlusOneUnit) {
  auto& comm = world();
  constexpr int kLayers = 8;
  constexpr std::int64_t kWidth = 1024;
  const auto build = [&](tensor::Device device) {
    tensor::Generator gen(13);
    auto model = std::make_unique<nn::Sequential>();
    for (int i = 0; i < kLayers; ++i) model->emplace<nn::Linear>(kWidth, kWidth, gen, true, DType::f32, device);
    return model;
  };
  SharedFolder dir("sharded_ckpt_resume_memory");
  double steady = 0, unit = 0;
  {
    auto model = build(tensor::Device::cpu());
    parallel::ShardedModel sharded(parallel::Sharding::fsdp, *model, comm, adamw, std::size_t{1} << 20);
    DistributedSampler sampler(64, comm.size(), comm.rank(), SamplerOptions{.seed = 1});
    TrainingState state(*model, sharded.optimizer(), sampler, sharded);
    tensor::Generator data_gen(comm.rank() + 1);
    nn::MSELoss loss;
    loss.forward(sharded.forward(tensor::normal({2, kWidth}, 0.0, 1.0, data_gen)), Tensor::zeros({2, kWidth}));
    sharded.optimizer_step_with_gradient_accumulation([&](double s) { return loss.backward(s); }, 1, 1000);
    state.step = 1;
    TrainingCheckpoint ckpt(dir.path, state, {.run_id = "mem", .world_size = comm.size()}, comm.rank() == 0);
    ckpt.save(1, 0);
    const auto local = state.local_state_slices();
    for (const parallel::StateSlice& piece : local->model)
      if (piece.data.defined()) steady += 16.0 * static_cast<double>(piece.data.numel());  // params, grads, 2 moments
    unit = 4.0 * static_cast<double>(kWidth * kWidth + kWidth);
  }
  const auto live = tensor::host_memory_stats().live_bytes;
  tensor::reset_host_memory_peak();
  auto model = build(tensor::Device::meta());
  parallel::ShardedModel sharded(parallel::Sharding::fsdp, *model, comm, adamw, std::size_t{1} << 20);
  DistributedSampler sampler(64, comm.size(), comm.rank(), SamplerOptions{.seed = 1});
  TrainingState state(*model, sharded.optimizer(), sampler, sharded);
  TrainingCheckpoint ckpt(dir.path, state, {.run_id = "mem", .world_size = comm.size()}, comm.rank() == 0);
  ASSERT_TRUE(ckpt.resume().has_value());
  EXPECT_EQ(state.step, 1);
  const double peak = static_cast<double>(tensor::host_memory_stats().peak_bytes - live);
  EXPECT_LE(peak, 1.2 * steady + unit) << "rank " << comm.rank();
  if (comm.rank() == 0)
    std::printf(
        "fsdp resume of %.1f MB of parameters at %d ranks: peak %.1f MB from construction to the end of "
        "resume; steady state 16N/W = %.1f MB, one unit %.1f MB\n",
        4.0 * kLayers * kWidth * kWidth / 1e6, comm.size(), peak / 1e6, steady / 1e6, unit / 1e6);
}

std::int64_t max_over_ranks(std::int64_t v) {
  if (world().size() > 1) world().allreduce(collectives::Buffer(&v, 1), collectives::ReduceOp::max);
  return v;
}

// The bound, through the worker group's TrainingCheckpoint in fsdp mode: on a
// model of 103 MB of parameters (8 x 1792 x 1792 f32) with SGD momentum, no rank's
// peak RSS grows during save() by more than its own pieces (model + optimizer shard)
// + the largest tensor + 64 MB. The gathered save's groups alone (state_dicts(), the
// old path) are measured too, to show what the bound catches.
TEST(ShardedCheckpoint, FsdpSaveOfA100MbModelGrowsNoRanksPeakRssPastShardPlusLargestTensorPlus64Mb) {
  auto& comm = world();
  tensor::Generator gen(13);
  nn::Sequential model;
  for (int i = 0; i < 8; ++i) model.emplace<nn::Linear>(1792, 1792, gen);
  const std::int64_t largest = 1792 * 1792 * 4;
  auto sgd = [](std::vector<nn::NamedParameter> params) -> std::unique_ptr<nn::Optimizer> {
    return std::make_unique<nn::SGD>(std::move(params), 0.01, 0.9);
  };
  parallel::ShardedModel sharded(
      parallel::Sharding::fsdp, model, comm, sgd, std::size_t{25} << 20,
      parallel::FsdpOptions{.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Linear>()});
  DistributedSampler sampler(64, comm.size(), comm.rank(), SamplerOptions{.seed = 1});
  TrainingState state(model, sharded.optimizer(), sampler, sharded);
  {  // one step, so the momentum buffers exist
    tensor::Generator data_gen(comm.rank() + 1);
    nn::MSELoss loss;
    const Tensor x = tensor::normal({2, 1792}, 0.0, 1.0, data_gen);
    loss.forward(sharded.forward(x), Tensor::zeros({2, 1792}));
    sharded.optimizer_step_with_gradient_accumulation([&](double s) { return loss.backward(s); }, 1, 1000);
    state.step = 1;
  }
  SharedFolder dir("sharded_ckpt_big");
  TrainingCheckpoint ckpt(dir.path, state, {.run_id = "big", .world_size = comm.size()}, comm.rank() == 0);
  ASSERT_TRUE(ckpt.parallel());
  comm.barrier();
  testing::reset_peak_rss();
  std::int64_t before = testing::proc_status_bytes("VmRSS:");
  const auto start = std::chrono::steady_clock::now();
  const fs::path file = ckpt.save(1, 0).get();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::int64_t growth = testing::proc_status_bytes("VmHWM:") - before;
  // This rank's pieces, counted after the save (so that their copies are not made
  // before the measurement starts).
  std::int64_t shard = 0;
  {
    const auto local = state.local_state_slices();
    ASSERT_TRUE(local.has_value());
    for (const auto* pieces : {&local->model, &local->optimizer})
      for (const parallel::StateSlice& piece : *pieces)
        if (piece.data.defined()) shard += static_cast<std::int64_t>(piece.data.nbytes());
  }
  const std::int64_t bound = shard + largest + (std::int64_t{64} << 20);
  EXPECT_LT(growth, bound) << "rank " << comm.rank() << ": pieces " << shard << " bytes";
  const std::int64_t worst = max_over_ranks(growth), worst_over = max_over_ranks(growth - bound);

  // The old path's groups, for comparison (not bounded: they are the whole state).
  comm.barrier();
  testing::reset_peak_rss();
  before = testing::proc_status_bytes("VmRSS:");
  std::int64_t gathered_growth = 0;
  {
    const StateGroups groups = state.state_dicts();
    gathered_growth = testing::proc_status_bytes("VmHWM:") - before;
  }
  gathered_growth = max_over_ranks(gathered_growth);
  if (comm.rank() == 0) {
    std::printf(
        "fsdp save through TrainingCheckpoint of %.0f MB of parameters + %.0f MB of momentum at %d ranks: "
        "%.2f s, peak RSS growth %.1f MB on the worst rank (rank 0's pieces %.1f MB, bound = pieces + largest "
        "tensor + 64 MB = %.1f MB; worst margin %.1f MB); the gathered groups alone grew it by %.1f MB\n",
        8.0 * static_cast<double>(largest) / 1e6, 8.0 * static_cast<double>(largest) / 1e6, comm.size(), seconds,
        static_cast<double>(worst) / 1e6, static_cast<double>(shard) / 1e6, static_cast<double>(bound) / 1e6,
        static_cast<double>(-worst_over) / 1e6, static_cast<double>(gathered_growth) / 1e6);
    checkpoint::FileReader reader(file.string());
    EXPECT_TRUE(reader.has_group("/rng"));  // an empty section, as the gathered save writes it
    EXPECT_EQ(reader.tensors("/model").size(), 16u);
    reader.verify_all();
  }
}

}  // namespace
}  // namespace troupe::train
