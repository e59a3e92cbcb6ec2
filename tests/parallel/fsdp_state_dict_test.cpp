// FSDP's full state dicts under mpirun: DDP's keys, shapes and values for the model
// and the optimizer, loadable from DDP and at another world size, bad dicts refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "fsdp_harness.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/parallel_checkpoint.hpp"

namespace troupe::train {
namespace {

using namespace fsdp_testing;
using testing::world;

// The full dicts are DDP's: the model's keys/shapes/values, and the optimizer's under
// the full parameter names, loadable into a plain AdamW.
TEST(FullyShardedDataParallel, FullStateDictsEqualDdps) {
  DdpRun want(Shape::mlp, Opt::adamw);
  FsdpRun got(world(), Shape::mlp, Opt::adamw);
  Batches a(world()), b(world());
  for (int s = 0; s < 3; ++s) {
    want.step(a.next());
    got.step(b.next());
  }
  for (const auto& [want_dict, got_dict] : {std::pair{want.model->state_dict(), got.fsdp->full_state_dict()},
                                            std::pair{want.opt->state_dict(), got.fsdp->full_optimizer_state_dict()}}) {
    ASSERT_EQ(got_dict.keys(), want_dict.keys());
    for (const auto& [key, value] : want_dict) {
      const Tensor& other = got_dict.at(key);
      ASSERT_EQ(other.shape(), value.shape()) << key;
      ASSERT_EQ(other.dtype(), value.dtype()) << key;
      EXPECT_LE(testing::max_relative_difference(other.to_vector<double>(), value.to_vector<double>()), 1e-5) << key;
    }
  }
  auto model = testing::make_mlp(kModelSeed);
  nn::AdamW unsharded(model->named_parameters());
  EXPECT_NO_THROW(unsharded.load_state_dict(got.fsdp->full_optimizer_state_dict()));
  EXPECT_EQ(unsharded.step_count(), 3);
  EXPECT_NO_THROW(model->load_state_dict(got.fsdp->full_state_dict()));

  // And the other way: DDP's dicts load into a fresh FSDP, which then trains like DDP.
  FsdpRun resumed(world(), Shape::mlp, Opt::adamw, /*seed=*/99);
  resumed.fsdp->load_full_state_dict(want.model->state_dict());
  resumed.fsdp->load_full_optimizer_state_dict(want.opt->state_dict());
  Batches c(world(), 3);
  for (int s = 3; s < 6; ++s) {
    const TensorBatch batch = c.next();
    want.step(batch);
    resumed.step(batch);
  }
  EXPECT_LE(testing::max_relative_difference(resumed.params(), testing::flat_parameters(*want.model)), 1e-5);
}

// Save at W ranks after 5 steps; a fresh FSDP at W/2 ranks (or 1) restored from the
// dicts takes the next 5 steps like the run that never stopped, and so does zero1.
TEST(FullyShardedDataParallel, FullStateDictsContinueAtAnotherWorldSizeInFsdpAndInZero1) {
  auto& comm = world();
  FsdpRun first(comm, Shape::odd, Opt::adamw);
  Batches batches(comm);
  for (int s = 0; s < 5; ++s) first.step(batches.next());
  const nn::StateDict model_dict = first.fsdp->full_state_dict();
  const nn::StateDict optim_dict = first.fsdp->full_optimizer_state_dict();
  for (int s = 5; s < 10; ++s) first.step(batches.next());
  const auto want = first.params();

  const int half = std::max(1, comm.size() / 2);
  auto sub = comm.split(comm.rank() / half, comm.rank() % half);
  ASSERT_EQ(sub->size(), half);
  FsdpRun second(*sub, Shape::odd, Opt::adamw, /*seed=*/99);
  second.fsdp->load_full_state_dict(model_dict);
  second.fsdp->load_full_optimizer_state_dict(optim_dict);
  EXPECT_EQ(second.fsdp->optimizer().step_count(), 5);
  Batches resumed(*sub, 5);
  for (int s = 5; s < 10; ++s) second.step(resumed.next());
  EXPECT_LE(testing::max_relative_difference(second.params(), want), 1e-5);

  // And in another mode: zero1 (DDP + OSS) on the same smaller communicator.
  auto model = make_model(Shape::odd, 99);
  parallel::DistributedDataParallel ddp(*model, *sub);
  parallel::OSS oss(model->named_parameters(), *sub, factory(Opt::adamw));
  model->load_state_dict(model_dict);
  oss.load_state_dict(optim_dict);
  Batches again(*sub, 5);
  nn::CrossEntropyLoss loss;
  for (int s = 5; s < 10; ++s) {
    const TensorBatch b = again.next();
    loss.forward(ddp.forward(b.inputs), b.targets);
    ddp.backward(loss.backward());
    oss.step();
    oss.zero_grad();
  }
  EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*model), want), 1e-5);
}

TEST(FullyShardedDataParallel, LoadFullStateDictRejectsAWrongShapeOnEveryRank) {
  FsdpRun run(world(), Shape::mlp, Opt::adamw);
  const nn::StateDict good = run.fsdp->full_state_dict();
  nn::StateDict bad;
  for (const auto& [key, value] : good) bad.insert(key, key == "2.weight" ? Tensor::zeros({32, 31}) : value);
  try {
    run.fsdp->load_full_state_dict(bad);
    ADD_FAILURE() << "a wrong shape was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("2.weight"), std::string::npos) << e.what();
  }
  nn::StateDict missing;
  for (const auto& [key, value] : good)
    if (key != "4.bias") missing.insert(key, value);
  EXPECT_THROW(run.fsdp->load_full_state_dict(missing), InvalidArgument);
  EXPECT_EQ(testing::max_relative_difference(run.params(),
                                             [&] {
                                               std::vector<double> v;
                                               for (const auto& [key, value] : good) {
                                                 const auto x = value.to_vector<double>();
                                                 v.insert(v.end(), x.begin(), x.end());
                                               }
                                               return v;
                                             }()),
            0.0);
}

// A full-state-dict checkpoint with no gathering at all: each rank hands its shard's
// pieces to the parallel save, and the one HDF5 file holds exactly full_state_dict()
// and full_optimizer_state_dict() under /model and /optimizer.
TEST(FullyShardedDataParallel, LocalSlicesWriteTheFullStateDictsThroughTheParallelSave) {
  auto& comm = world();
  FsdpRun run(comm, Shape::odd, Opt::adamw);  // a padded unit and the root unit
  Batches batches(comm);
  for (int s = 0; s < 3; ++s) run.step(batches.next());

  checkpoint::SaveManifest manifest;
  manifest.step = 3;
  manifest.world_size = comm.size();
  std::vector<checkpoint::Slice> slices;
  for (const auto& group : {std::pair{std::string("/model/"), run.fsdp->local_model_slices()},
                            std::pair{std::string("/optimizer/"), run.fsdp->local_optimizer_slices()}})
    for (const auto& piece : group.second) {
      manifest.add_tensor(group.first + piece.name, piece.dtype, piece.shape);
      slices.push_back(checkpoint::Slice{piece.begin, piece.data});
    }
  std::int64_t pid = comm.rank() == 0 ? static_cast<std::int64_t>(getpid()) : 0;
  if (comm.size() > 1) comm.allreduce(collectives::Buffer(&pid, 1), collectives::ReduceOp::max);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("troupe_fsdp_" + std::to_string(pid));
  std::filesystem::path file;
  {
    checkpoint::ParallelCheckpoint ckpt(dir, 1, MPI_COMM_WORLD);
    file = ckpt.save(manifest, slices);
  }
  const nn::StateDict model = run.fsdp->full_state_dict();
  const nn::StateDict optim = run.fsdp->full_optimizer_state_dict();
  checkpoint::FileReader reader(file.string());
  for (const auto& [group, dict] :
       {std::pair{std::string("/model/"), &model}, std::pair{std::string("/optimizer/"), &optim}})
    for (const auto& [key, value] : *dict) {
      if (key.find('/') == std::string::npos && group == "/optimizer/") continue;  // hyper-parameters: attributes
      const Tensor saved = reader.read(group + key);
      ASSERT_EQ(saved.shape(), value.shape()) << key;
      EXPECT_EQ(saved.to_vector<double>(), value.to_vector<double>()) << key;
    }
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

// The bound for a save: no rank's peak RSS grows by more than its shard plus
// the largest tensor plus 64 MB, on a model of 100 MB of parameters. With the local
// slices nothing is gathered, so the growth is the writer's own buffers.
TEST(FullyShardedDataParallel, ParallelSaveOfA100MbModelGrowsNoRanksPeakRssPastShardPlusLargestTensorPlus64Mb) {
  auto& comm = world();
  tensor::Generator gen(13);
  nn::Sequential model;
  for (int i = 0; i < 8; ++i) model.emplace<nn::Linear>(1792, 1792, gen);  // 8 x 12.9 MB = 103 MB
  const std::int64_t largest = 1792 * 1792 * 4;
  parallel::FullyShardedDataParallel fsdp(model, comm, factory(Opt::sgd_momentum),
                                          {.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Linear>()});
  checkpoint::SaveManifest manifest;
  manifest.world_size = comm.size();
  std::vector<checkpoint::Slice> slices;
  for (const auto& piece : fsdp.local_model_slices()) {
    manifest.add_tensor("/model/" + piece.name, piece.dtype, piece.shape);
    slices.push_back(checkpoint::Slice{piece.begin, piece.data});
  }
  std::int64_t pid = comm.rank() == 0 ? static_cast<std::int64_t>(getpid()) : 0;
  if (comm.size() > 1) comm.allreduce(collectives::Buffer(&pid, 1), collectives::ReduceOp::max);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("troupe_fsdp_big_" + std::to_string(pid));
  {
    checkpoint::ParallelCheckpoint ckpt(dir, 1, MPI_COMM_WORLD);
    // Reset the peak to the current RSS (Linux's clear_refs 5), then save.
    testing::reset_peak_rss();
    const std::int64_t before = testing::proc_status_bytes("VmRSS:");
    ckpt.save(manifest, slices);
    const std::int64_t growth = testing::proc_status_bytes("VmHWM:") - before;
    const auto bound = static_cast<std::int64_t>(fsdp.shard_parameter_bytes()) + largest + (std::int64_t{64} << 20);
    EXPECT_LT(growth, bound);
    std::int64_t worst = growth;
    if (comm.size() > 1) comm.allreduce(collectives::Buffer(&worst, 1), collectives::ReduceOp::max);
    if (comm.rank() == 0)
      std::printf(
          "parallel save of %.0f MB from fsdp at %d ranks: peak RSS growth %.1f MB on the worst rank "
          "(bound %.1f MB = shard + largest tensor + 64 MB)\n",
          static_cast<double>(8 * largest) / 1e6, comm.size(), static_cast<double>(worst) / 1e6,
          static_cast<double>(bound) / 1e6);
  }
  // The measurement sees materialisation: full_state_dict() holds the whole model.
  testing::reset_peak_rss();
  const std::int64_t before = testing::proc_status_bytes("VmRSS:");
  const nn::StateDict full = fsdp.full_state_dict();
  EXPECT_GT(testing::proc_status_bytes("VmHWM:") - before, 7 * largest);
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe::train
