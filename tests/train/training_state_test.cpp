// TrainingState: a run restored from a snapshot continues bit for bit like the run
// that never stopped -- the property the checkpoint module builds on.
#include <gtest/gtest.h>

#include "train_world.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/grad_scaler.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/distributed_sampler.hpp"
#include "troupe/train/training_state.hpp"

namespace troupe::train {
namespace {

using testing::world;

constexpr std::int64_t kMicroBatch = 4;
constexpr std::int64_t kMicroPerEpoch = 6;

// A whole training setup, with dropout (RNG state), momentum (optimizer slots), a
// loss scaler and gradient accumulation.
struct TrainingRun {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  std::unique_ptr<nn::SGD> sgd;
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<parallel::GradScaler> scaler;
  std::unique_ptr<TrainingState> state;
  TensorDataset data = testing::make_data(kMicroBatch * kMicroPerEpoch * world().size(), 21);
  nn::CrossEntropyLoss loss_fn;

  explicit TrainingRun(std::uint64_t seed) {
    tensor::Generator gen(seed);
    model = std::make_unique<nn::Sequential>();
    model->emplace<nn::Linear>(16, 32, gen);
    model->emplace<nn::ReLU>();
    model->emplace<nn::Dropout>(0.25, seed);
    model->emplace<nn::Linear>(32, 4, gen);
    ddp = std::make_unique<parallel::DistributedDataParallel>(*model, world());
    sgd = std::make_unique<nn::SGD>(model->named_parameters(), 0.05, 0.9);
    sampler =
        std::make_unique<DistributedSampler>(data.size(), world().size(), world().rank(), SamplerOptions{.seed = seed});
    scaler = std::make_unique<parallel::GradScaler>(
        &world(), parallel::GradScalerOptions{.init_scale = 256, .growth_interval = 3});
    state = std::make_unique<TrainingState>(*model, *sgd, *sampler, ddp.get(), scaler.get());
  }

  void train(int micro_steps) {
    for (int i = 0; i < micro_steps; ++i) {
      if (sampler->exhausted()) sampler->set_epoch(++state->epoch);
      const TensorBatch batch = data.rows(sampler->take(kMicroBatch));
      loss_fn.forward(ddp->forward(batch.inputs), batch.targets);
      const auto r = ddp->optimizer_step_with_gradient_accumulation(*sgd, [&](double s) { return loss_fn.backward(s); },
                                                                    2, kMicroPerEpoch, {.scaler = scaler.get()});
      state->step += r.stepped;
    }
  }
};

TEST(TrainingState, ARestoredRunContinuesBitForBitLikeTheOneThatNeverStopped) {
  TrainingRun original(1);
  original.train(4);  // mid-epoch, at a window boundary
  const StateGroups snapshot = clone(original.state->state_dicts());
  original.train(10);  // across the end of the epoch

  TrainingRun restored(99);  // other seed: everything must come from the snapshot
  restored.state->load_state_dicts(snapshot);
  EXPECT_EQ(restored.sampler->position(), 4 * kMicroBatch);
  EXPECT_EQ(restored.ddp->micro_step(), 4);
  restored.train(10);

  EXPECT_EQ(testing::parameter_hash(*restored.model), testing::parameter_hash(*original.model));
  EXPECT_EQ(restored.state->step, original.state->step);
  EXPECT_EQ(restored.state->epoch, 2);  // micro-steps 12 and 13 of 6 per epoch
  EXPECT_DOUBLE_EQ(restored.scaler->scale(), original.scaler->scale());
  auto& dropout = static_cast<nn::Dropout&>((*restored.model)[2]);
  EXPECT_EQ(dropout.generator().offset(), static_cast<nn::Dropout&>((*original.model)[2]).generator().offset());
}

TEST(TrainingState, NamesItsGroupsAndRefusesASnapshotWithOneMissing) {
  TrainingRun run(2);
  StateGroups groups = run.state->state_dicts();
  std::vector<std::string> names;
  for (const auto& [name, dict] : groups) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"model", "optimizer", "sampler", "scaler", "rng", "status"}));
  EXPECT_TRUE(groups[4].second.contains("2.seed"));
  groups.erase(groups.begin() + 2);
  try {
    run.state->load_state_dicts(groups);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("group 'sampler' is missing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::train
