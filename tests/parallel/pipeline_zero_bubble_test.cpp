// The zero-bubble schedule (troupe/parallel/pipeline.hpp): weight passes fill a stage's
// waits, each micro-batch's once, without changing a bit of the result, tensor
// parallelism included (the schedules' agreement with one rank is in pipeline_test.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "gpt_testing.hpp"
#include "train_world.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/parallel/device_mesh.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/trace.hpp"

// A named namespace: this file shares a unity build with pipeline_test.cpp.
namespace troupe::train::testing::pipeline_zero_bubble {

using parallel::GptStage;
using parallel::Pipeline;
using parallel::PipelineSchedule;

// The last stage's loss takes 30 ms longer than anything else in the step, so every
// other stage waits for each gradient with the weight passes of the micro-batches
// before it queued: those waits must be filled, and each pass run exactly once.
TEST(ZeroBubble, WeightPassesFillTheWaitsForGradients) {
  if (world().size() < 2) GTEST_SKIP() << "needs two or more stages";
  const nn::GPTConfig config{.block_size = 16, .vocab_size = 65, .n_layer = 4, .n_head = 2, .n_embd = 16};
  GptStage stage(config, 3, world().rank(), world().size());
  constexpr int kMicroBatches = 4;
  Pipeline pipe(stage, world(), PipelineSchedule::zero_bubble, kMicroBatches);
  nn::CrossEntropyLoss ce;
  parallel::PipelineLoss loss = pipeline_loss(ce);
  loss.forward = [&ce](const tensor::Tensor& out, const tensor::Tensor& y) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return ce.forward(out, y).item();
  };
  Tracer tracer;
  pipe.set_tracer(&tracer);
  tracer.start();
  EXPECT_TRUE(std::isfinite(pipe.forward_backward(token_ids(8, 16, 65, 1), token_ids(8, 16, 65, 2), loss)));
  tracer.stop();
  std::vector<int> passes(kMicroBatches, 0);
  for (const TraceSpan& span : tracer.take()) {
    if (span.category != "compute" || span.name != "weight gradients") continue;
    const std::string key = "\"micro_batch\":";
    const auto at = span.args.find(key);
    ASSERT_NE(at, std::string::npos) << span.args;
    ++passes.at(static_cast<std::size_t>(std::stoi(span.args.substr(at + key.size()))));
  }
  EXPECT_EQ(passes, std::vector<int>(kMicroBatches, 1));
  const bool last = world().rank() == world().size() - 1;
  if (!last) {
    EXPECT_GE(pipe.stats().weight_passes_while_waiting, 1) << "stage " << world().rank();
  }
  // Nothing is left deferred, or put off for good: every parameter has its gradient.
  for (const auto& [name, param] : stage.named_parameters())
    EXPECT_TRUE(param->grad.defined()) << name << " on stage " << world().rank();
}

// Each stage split over tp (pp 1 x tp 2 at 2 ranks, 2 x 2 at 4, 4 x 2 at 8): the
// column- and row-parallel Linears defer too, and zero-bubble trains as 1F1B, bit for bit.
TEST(Pipeline, StagesSplitOverTensorParallelRanksTrainUnderZeroBubbleAsUnder1F1B) {
  if (world().size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  parallel::DeviceMesh mesh(world(), {{"pp", world().size() / 2}, {"tp", 2}});
  collectives::Communicator& pp = mesh.comm("pp");
  collectives::Communicator& tp = mesh.comm("tp");
  const nn::GPTConfig config{.block_size = 16, .vocab_size = 65, .n_layer = 4, .n_head = 2, .n_embd = 16};
  std::vector<double> losses[2];
  nn::StateDict states[2];
  for (const PipelineSchedule schedule : {PipelineSchedule::one_f_one_b, PipelineSchedule::zero_bubble}) {
    const bool zb = schedule == PipelineSchedule::zero_bubble;
    GptStage stage(config, 5, pp.rank(), pp.size(), &tp);
    Pipeline pipe(stage, pp, schedule, 4);
    nn::AdamW opt(stage.named_parameters(), 3e-3);
    parallel::VocabParallelCrossEntropy ce(tp, 65);
    const parallel::PipelineLoss loss = pipeline_loss(ce);
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      losses[zb].push_back(
          pipe.forward_backward(token_ids(8, 16, 65, 100 + step), token_ids(8, 16, 65, 500 + step), loss));
      stage.reduce_tied_gradient(pp);
      parallel::pipeline_clip_grad_norm(stage, 0.1, pp, &tp);
      opt.step();
      stage.broadcast_tied_table(pp);
    }
    states[zb] = parallel::pipeline_full_state_dict(stage, pp, &tp);
  }
  EXPECT_EQ(losses[1], losses[0]);
  for (const auto& [name, value] : states[0])
    EXPECT_EQ(states[1].at(name).to_vector<float>(), value.to_vector<float>()) << name;
}

TEST(ZeroBubble, IsNamedOnTheCommandLine) {
  EXPECT_EQ(parallel::parse_pipeline_schedule("zero-bubble"), PipelineSchedule::zero_bubble);
  EXPECT_STREQ(parallel::pipeline_schedule_name(PipelineSchedule::zero_bubble), "zero-bubble");
  try {
    parallel::parse_pipeline_schedule("zb");
    ADD_FAILURE() << "'zb' was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("zero-bubble"), std::string::npos) << e.what();
  }
}

}  // namespace troupe::train::testing::pipeline_zero_bubble
