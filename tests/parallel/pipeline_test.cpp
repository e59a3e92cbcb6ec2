// Pipeline parallelism (troupe/parallel/pipeline.hpp): a GPT cut into world-size stages
// against the whole model trained on every rank as the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpt_testing.hpp"
#include "train_world.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::train::testing {
namespace {

using parallel::GptStage;
using parallel::Pipeline;
using parallel::PipelineSchedule;

nn::GPTConfig tiny_gpt(double dropout = 0.0) {
  return {.block_size = 16, .vocab_size = 65, .n_layer = 4, .n_head = 2, .n_embd = 16, .dropout = dropout};
}

std::unique_ptr<nn::AdamW> adamw(nn::Module& m) {
  auto opt = std::make_unique<nn::AdamW>(m.named_parameters(), 3e-3, nn::Betas{0.9, 0.95}, 1e-8, 0.1);
  opt->set_weight_decay_filter(nn::decay_matrices_only);
  return opt;
}

struct PipelineRun {
  std::vector<double> losses;
  nn::StateDict full;
};

PipelineRun train_pipeline(PipelineSchedule schedule, double dropout, int steps) {
  GptStage stage(tiny_gpt(dropout), 5, world().rank(), world().size());
  Pipeline pipe(stage, world(), schedule, 4);
  auto opt = adamw(stage);
  nn::CrossEntropyLoss ce;
  const parallel::PipelineLoss loss{[&ce](const Tensor& out, const Tensor& y) { return ce.forward(out, y).item(); },
                                    [&ce](double scale) { return ce.backward(scale); }};
  PipelineRun run;
  for (int step = 0; step < steps; ++step) {
    opt->zero_grad();
    run.losses.push_back(
        pipe.forward_backward(token_ids(8, 16, 65, 100 + step), token_ids(8, 16, 65, 500 + step), loss));
    stage.sum_tied_gradient(world());
    parallel::pipeline_clip_grad_norm(stage, 1.0, world());
    opt->step();
  }
  run.full = parallel::pipeline_full_state_dict(stage, world());
  return run;
}

// Issue 51's bar, as for tensor parallelism: every step's loss within 1e-5 of one rank's
// over 20 steps (the batch whole there, 4 micro-batches here). The parameters agree to
// 1e-4 in norm, not 1e-5: summing 4 micro-batches' gradients rounds differently from one
// batch's, which AdamW carries into the small biases (1.07e-5 at 1 rank as at 4).
TEST(Pipeline, BothSchedulesTrainAsOneRank) {
  nn::GPT whole(tiny_gpt(), 5);
  auto opt = adamw(whole);
  nn::CrossEntropyLoss ce;
  std::vector<double> reference;
  for (int step = 0; step < 20; ++step) {
    opt->zero_grad();
    reference.push_back(
        ce.forward(whole.forward(token_ids(8, 16, 65, 100 + step)), token_ids(8, 16, 65, 500 + step)).item());
    whole.backward(ce.backward());
    nn::clip_grad_norm(whole.named_parameters(), 1.0);
    opt->step();
  }
  for (PipelineSchedule schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
    SCOPED_TRACE(parallel::pipeline_schedule_name(schedule));
    const PipelineRun run = train_pipeline(schedule, 0.0, 20);
    for (std::size_t i = 0; i < reference.size(); ++i)
      ASSERT_LE(std::abs(run.losses[i] - reference[i]), 1e-5 * reference[i]) << "step " << i;
    ASSERT_EQ(run.full.keys(), whole.state_dict().keys());
    for (const auto& [name, value] : whole.state_dict()) {
      if (name.ends_with("attn.c_attn.bias")) continue;  // the key bias: see tensor_parallel_test.cpp
      EXPECT_LT(norm_relative(run.full.at(name), value), 1e-4) << name;
    }
  }
}

// Both run each stage's backwards in micro-batch order, and a recompute leaves the
// dropout generators where the forwards left them, so with dropout on the schedules
// agree bit for bit.
TEST(Pipeline, GpipeAndOneFOneBAgreeBitForBitWithDropout) {
  const PipelineRun gpipe = train_pipeline(PipelineSchedule::gpipe, 0.2, 4);
  const PipelineRun interleaved = train_pipeline(PipelineSchedule::one_f_one_b, 0.2, 4);
  EXPECT_EQ(gpipe.losses, interleaved.losses);
  for (const auto& [name, value] : gpipe.full)
    EXPECT_EQ(value.to_vector<float>(), interleaved.full.at(name).to_vector<float>()) << name;
}

// Activations of 32 KB, past shared memory's eager limit: a send then completes only
// once its receive is posted, which deadlocked 1F1B when both directions shared one
// communicator's queue (a wait covers every operation started before it).
TEST(Pipeline, ActivationsPastTheEagerLimitFlowBothWays) {
  const nn::GPTConfig config{.block_size = 64, .vocab_size = 65, .n_layer = 4, .n_head = 2, .n_embd = 64};
  for (PipelineSchedule schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
    GptStage stage(config, 2, world().rank(), world().size());
    Pipeline pipe(stage, world(), schedule, 4);
    nn::CrossEntropyLoss ce;
    const parallel::PipelineLoss loss{[&ce](const Tensor& out, const Tensor& y) { return ce.forward(out, y).item(); },
                                      [&ce](double scale) { return ce.backward(scale); }};
    for (int step = 0; step < 2; ++step)
      EXPECT_TRUE(std::isfinite(pipe.forward_backward(token_ids(8, 64, 65, 3), token_ids(8, 64, 65, 4), loss)));
  }
}

TEST(Pipeline, EvaluationForwardGivesTheWholeModelsLogits) {
  GptStage stage(tiny_gpt(), 3, world().rank(), world().size());
  Pipeline pipe(stage, world(), PipelineSchedule::one_f_one_b, 2);
  nn::GPT whole(tiny_gpt(), 3);
  const Tensor x = token_ids(2, 16, 65, 7);
  const Tensor out = pipe.forward(x);
  if (world().rank() == world().size() - 1)
    EXPECT_EQ(out.to_vector<float>(), whole.forward(x).to_vector<float>());
  else
    EXPECT_FALSE(out.defined());
}

TEST(Pipeline, BadLayoutsAreNamed) {
  nn::GPTConfig config = tiny_gpt();
  config.n_layer = 1;
  if (world().size() > 1) {
    EXPECT_THROW(GptStage(config, 1, world().rank(), world().size()), InvalidArgument);
  }
  EXPECT_THROW(parallel::parse_pipeline_schedule("zb"), InvalidArgument);
  GptStage stage(tiny_gpt(), 1, world().rank(), world().size());
  Pipeline pipe(stage, world(), PipelineSchedule::gpipe, 3);
  nn::CrossEntropyLoss ce;
  const parallel::PipelineLoss loss{[&ce](const Tensor& out, const Tensor& y) { return ce.forward(out, y).item(); },
                                    [&ce](double scale) { return ce.backward(scale); }};
  // 8 rows into 3 micro-batches: the first and last stages see it before anything is sent.
  if (world().size() <= 2) {
    EXPECT_THROW(pipe.forward_backward(token_ids(8, 16, 65, 1), token_ids(8, 16, 65, 2), loss), InvalidArgument);
  }
}

}  // namespace
}  // namespace troupe::train::testing
