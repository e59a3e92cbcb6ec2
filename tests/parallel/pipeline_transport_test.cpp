// What passes between pipeline stages and what a stage holds meanwhile
// (troupe/parallel/pipeline.hpp): sends past the eager limit, headers, the memory of
// the micro-batches in flight, and the trace spans of a stage's backward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpt_testing.hpp"
#include "train_world.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/trace.hpp"

// A named namespace: this file shares a unity build with pipeline_test.cpp.
namespace troupe::train::testing::pipeline_transport {

using parallel::GptStage;
using parallel::Pipeline;
using parallel::PipelineSchedule;

nn::GPTConfig small_gpt() { return {.block_size = 16, .vocab_size = 65, .n_layer = 4, .n_head = 2, .n_embd = 16}; }

// Activations of 32 KB, past shared memory's eager limit: a send then completes only
// once its receive is posted, which deadlocked 1F1B when both directions shared one
// communicator's queue (a wait covers every operation started before it).
TEST(Pipeline, ActivationsPastTheEagerLimitFlowBothWays) {
  const nn::GPTConfig config{.block_size = 64, .vocab_size = 65, .n_layer = 4, .n_head = 2, .n_embd = 64};
  for (PipelineSchedule schedule : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
    GptStage stage(config, 2, world().rank(), world().size());
    Pipeline pipe(stage, world(), schedule, 4);
    nn::CrossEntropyLoss ce;
    const parallel::PipelineLoss loss = pipeline_loss(ce);
    for (int step = 0; step < 2; ++step)
      EXPECT_TRUE(std::isfinite(pipe.forward_backward(token_ids(8, 64, 65, 3), token_ids(8, 64, 65, 4), loss)));
  }
}

// Micro-batches of one step share a shape, so only the first carries a header: a stage
// sends m + 1 messages of activations a step, not 2m, and its neighbour receives as many.
TEST(Pipeline, OnlyTheFirstMicroBatchOfAStepSendsAHeader) {
  if (world().size() < 2) GTEST_SKIP() << "needs two or more stages";
  constexpr int kMicroBatches = 4;
  GptStage stage(small_gpt(), 3, world().rank(), world().size());
  Pipeline pipe(stage, world(), PipelineSchedule::one_f_one_b, kMicroBatches);
  nn::CrossEntropyLoss ce;
  const parallel::PipelineLoss loss = pipeline_loss(ce);
  Tracer tracer;
  pipe.set_tracer(&tracer);
  tracer.start();
  for (int step = 0; step < 2; ++step)
    EXPECT_TRUE(std::isfinite(pipe.forward_backward(token_ids(8, 16, 65, 1), token_ids(8, 16, 65, 2), loss)));
  tracer.stop();
  int sends = 0, receives = 0;
  for (const TraceSpan& span : tracer.take()) {
    if (span.track != "pp activations") continue;
    sends += span.name == "send";
    receives += span.name == "recv";
  }
  const int rank = world().rank(), last = world().size() - 1;
  EXPECT_EQ(sends, rank < last ? 2 * (kMicroBatches + 1) : 0);
  EXPECT_EQ(receives, rank > 0 ? 2 * (kMicroBatches + 1) : 0);
}

// 1F1B holds at most p micro-batches in flight on a stage (their activations, and the
// outputs whose sends are not done), so a stage's memory in a step does not grow with
// the step's micro-batches; GPipe's grows with them. The micro-batches' outputs here are
// past MPI's eager limit, so a send finishes only once its neighbour takes it.
TEST(Pipeline, OneFOneBHoldsAsManyMicroBatchesAsStagesNotAsTheStep) {
  if (world().size() < 2) GTEST_SKIP() << "needs two or more stages";
  const nn::GPTConfig config{.block_size = 64, .vocab_size = 65, .n_layer = 4, .n_head = 2, .n_embd = 64};
  const auto step_peak = [&](PipelineSchedule schedule, int micro_batches) {
    GptStage stage(config, 2, world().rank(), world().size());
    Pipeline pipe(stage, world(), schedule, micro_batches);
    nn::CrossEntropyLoss ce;
    const parallel::PipelineLoss loss = pipeline_loss(ce);
    const Tensor x = token_ids(2 * micro_batches, 64, 65, 3), y = token_ids(2 * micro_batches, 64, 65, 4);
    pipe.forward_backward(x, y, loss);  // the gradients made
    const auto live = static_cast<std::int64_t>(tensor::host_memory_stats().live_bytes);
    tensor::reset_host_memory_peak();
    pipe.forward_backward(x, y, loss);
    std::vector<std::int64_t> peak{static_cast<std::int64_t>(tensor::host_memory_stats().peak_bytes) - live};
    world().allreduce(collectives::Buffer(peak), collectives::ReduceOp::max);  // the worst stage's
    return static_cast<double>(peak[0]);
  };
  const double f4 = step_peak(PipelineSchedule::one_f_one_b, 4), f8 = step_peak(PipelineSchedule::one_f_one_b, 8);
  const double g4 = step_peak(PipelineSchedule::gpipe, 4), g8 = step_peak(PipelineSchedule::gpipe, 8);
  EXPECT_LE(f8, 1.02 * f4) << "1F1B: 4 micro-batches " << f4 << " B, 8 micro-batches " << f8 << " B";
  EXPECT_GE(g8, 1.5 * g4) << "GPipe: 4 micro-batches " << g4 << " B, 8 micro-batches " << g8 << " B";
}

// A backward span says when the stage runs forward again, for the whole stage or only
// some of its blocks.
TEST(Pipeline, BackwardSpansSayWhenTheStageRecomputes) {
  for (const std::int64_t every : {0, 1}) {
    GptStage stage(small_gpt(), 3, world().rank(), world().size());
    stage.checkpoint_blocks(every);
    Pipeline pipe(stage, world(), PipelineSchedule::one_f_one_b, 2);
    nn::CrossEntropyLoss ce;
    const parallel::PipelineLoss loss = pipeline_loss(ce);
    Tracer tracer;
    pipe.set_tracer(&tracer);
    tracer.start();
    EXPECT_TRUE(std::isfinite(pipe.forward_backward(token_ids(4, 16, 65, 1), token_ids(4, 16, 65, 2), loss)));
    tracer.stop();
    int backwards = 0, recomputing = 0;
    for (const TraceSpan& span : tracer.take()) {
      if (span.category != "compute" || span.name != "backward") continue;
      ++backwards;
      recomputing += span.args.find("\"recomputes_forward\":true") != std::string::npos;
    }
    EXPECT_EQ(backwards, 2);
    EXPECT_EQ(recomputing, every == 0 ? 0 : 2) << "checkpoint_blocks(" << every << ")";
  }
}

}  // namespace troupe::train::testing::pipeline_transport
