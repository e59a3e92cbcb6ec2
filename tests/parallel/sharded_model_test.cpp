// ShardedModel, the worker group's zero1/zero2/fsdp: each mode takes DDP's accumulated,
// clipped steps, and a TrainingState snapshot of it (full, unsharded groups) restores
// bit for bit -- also into another mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "train_world.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/sharded_model.hpp"
#include "troupe/train/distributed_sampler.hpp"
#include "troupe/train/training_state.hpp"

namespace troupe::train {
namespace {

using testing::world;

constexpr std::int64_t kMicroBatch = 4;
constexpr std::int64_t kMicroPerEpoch = 6;
constexpr int kAccum = 2;
constexpr double kMaxNorm = 0.2;  // small enough that the test MLP's steps are clipped

std::unique_ptr<nn::Optimizer> sgd(std::vector<nn::NamedParameter> params) {
  return std::make_unique<nn::SGD>(std::move(params), 0.05, 0.9);
}

// One mode's run: the model, its wrapper (DDP itself for ddp), sampler and state.
struct ModeRun {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  std::unique_ptr<nn::Optimizer> optimizer;  // ddp only
  std::unique_ptr<parallel::ShardedModel> sharded;
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<TrainingState> state;
  TensorDataset data = testing::make_data(kMicroBatch * kMicroPerEpoch * world().size(), 21);
  nn::CrossEntropyLoss loss_fn;
  double largest_norm = 0;  // of the steps' gradients, before clipping

  ModeRun(parallel::Sharding mode, std::uint64_t seed) : model(testing::make_mlp(seed)) {
    sampler =
        std::make_unique<DistributedSampler>(data.size(), world().size(), world().rank(), SamplerOptions{.seed = seed});
    if (mode == parallel::Sharding::ddp) {
      ddp = std::make_unique<parallel::DistributedDataParallel>(*model, world());
      optimizer = sgd(model->named_parameters());
      state = std::make_unique<TrainingState>(*model, *optimizer, *sampler, ddp.get());
    } else {
      sharded = std::make_unique<parallel::ShardedModel>(mode, *model, world(), sgd, std::size_t{2000});
      state = std::make_unique<TrainingState>(*model, sharded->optimizer(), *sampler, *sharded);
    }
  }

  void train(int micro_steps) {
    for (int i = 0; i < micro_steps; ++i) {
      if (sampler->exhausted()) sampler->set_epoch(++state->epoch);
      const TensorBatch batch = data.rows(sampler->take(kMicroBatch));
      auto grad = [&](double s) { return loss_fn.backward(s); };
      parallel::AccumulationStep r;
      if (ddp) {
        loss_fn.forward(ddp->forward(batch.inputs), batch.targets);
        r = ddp->optimizer_step_with_gradient_accumulation(*optimizer, grad, kAccum, kMicroPerEpoch,
                                                           {.max_grad_norm = kMaxNorm});
      } else {
        loss_fn.forward(sharded->forward(batch.inputs), batch.targets);
        r = sharded->optimizer_step_with_gradient_accumulation(grad, kAccum, kMicroPerEpoch, kMaxNorm);
      }
      state->step += r.stepped;
      largest_norm = std::max(largest_norm, r.grad_norm);
    }
  }

  // The unwrapped model's parameters in named order (FSDP: gathered).
  std::vector<double> parameters() {
    const nn::StateDict dict = sharded ? sharded->model_state_dict() : model->state_dict();
    std::vector<double> out;
    for (const auto& named : model->named_parameters())
      for (double v : dict.at(named.name).to(DType::f64).to_vector<double>()) out.push_back(v);
    return out;
  }
  std::uint64_t hash() { return sharded ? sharded->parameter_hash() : testing::parameter_hash(*model); }
};

TEST(ShardedModel, EveryModeTakesDdpsAccumulatedClippedSteps) {
  ModeRun reference(parallel::Sharding::ddp, 5);
  reference.train(10);  // 5 windows of 2, across an epoch's end
  const std::vector<double> expected = reference.parameters();
  ASSERT_GT(reference.largest_norm, kMaxNorm);  // the clipping is exercised
  for (parallel::Sharding mode : {parallel::Sharding::zero1, parallel::Sharding::zero2, parallel::Sharding::fsdp}) {
    ModeRun run(mode, 5);
    run.train(10);
    EXPECT_EQ(run.state->step, reference.state->step) << parallel::sharding_name(mode);
    EXPECT_NEAR(run.largest_norm, reference.largest_norm, 1e-5 * reference.largest_norm)
        << parallel::sharding_name(mode);
    EXPECT_EQ(run.sharded->micro_step(), reference.ddp->micro_step()) << parallel::sharding_name(mode);
    EXPECT_LE(testing::max_relative_difference(run.parameters(), expected), 1e-5) << parallel::sharding_name(mode);
    EXPECT_TRUE(testing::same_on_every_rank(run.hash())) << parallel::sharding_name(mode);
  }
}

TEST(ShardedModel, ASnapshotRestoresBitForBitInItsOwnModeAndLoadsIntoAnother) {
  for (parallel::Sharding mode : {parallel::Sharding::zero1, parallel::Sharding::zero2, parallel::Sharding::fsdp}) {
    ModeRun original(mode, 1);
    original.train(4);  // mid-epoch, at a window boundary
    const StateGroups snapshot = clone(original.state->state_dicts());
    original.train(8);

    ModeRun restored(mode, 99);  // another seed: everything must come from the snapshot
    restored.state->load_state_dicts(snapshot);
    EXPECT_EQ(restored.sharded->micro_step(), 4) << parallel::sharding_name(mode);
    restored.train(8);
    EXPECT_EQ(restored.hash(), original.hash()) << parallel::sharding_name(mode);
    EXPECT_EQ(restored.state->step, original.state->step) << parallel::sharding_name(mode);

    // The groups are DDP's: a ddp run continues from them to the same parameters.
    ModeRun as_ddp(parallel::Sharding::ddp, 99);
    as_ddp.state->load_state_dicts(snapshot);
    as_ddp.train(8);
    EXPECT_LE(testing::max_relative_difference(as_ddp.parameters(), original.parameters()), 1e-5)
        << parallel::sharding_name(mode);
  }
}

TEST(ShardedModel, ParsesTheFourModeNamesAndRefusesOthers) {
  for (const char* name : {"ddp", "zero1", "zero2", "fsdp"})
    EXPECT_STREQ(parallel::sharding_name(parallel::parse_sharding(name)), name);
  try {
    parallel::parse_sharding("zero3");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown sharding mode 'zero3' (one of ddp, zero1, zero2, fsdp)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace troupe::train
