// The ZeRO memory formulas, checked against what the host allocator really holds
// (tensor::host_memory_stats(), the host's torch.cuda.max_memory_allocated): AdamW in
// f32 over N parameters at W ranks keeps per rank
//   ddp    16N            parameters 4N, gradients 4N (the buckets), moments 8N
//   zero1  8N + 8N/W      the moments sharded (OSS)
//   zero2  4N + 12N/W     gradients sharded too (ShardedDataParallel)
//   fsdp   16N/W          everything sharded, plus the units gathered while they run
// measured as the peak of live bytes over a whole training step (forward, backward,
// step) taken after the first step has created the optimizer state, less what was live
// before the model was built. Activations are a few KB here (batch 2), so the peak is
// model state plus the wrapper's buffers: OSS's window for sharing the updated
// parameters (one bucket) in zero1 and zero2, and zero2's bucket in flight; gathered
// units and their flat gradients for fsdp.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "train_world.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/sharded_model.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::train {
namespace {

using testing::world;

constexpr std::int64_t kBatch = 2;
constexpr std::int64_t kWidth = 1024;
constexpr int kLayers = 8;                      // 8 x Linear(1024, 1024): N = 8.4M, 33.6 MB
constexpr std::size_t kBucketBytes = 1u << 20;  // small next to the model state

std::unique_ptr<nn::Sequential> make_model() {
  tensor::Generator gen(3);
  auto model = std::make_unique<nn::Sequential>();
  for (int i = 0; i < kLayers; ++i) {
    model->emplace<nn::Linear>(kWidth, kWidth, gen);
    if (i + 1 < kLayers) model->emplace<nn::ReLU>();
  }
  return model;
}

std::unique_ptr<nn::Optimizer> adamw(std::vector<nn::NamedParameter> params) {
  return std::make_unique<nn::AdamW>(std::move(params), 1e-3);
}

struct Measured {
  double steady = 0;  // bytes live after a step, above the baseline
  double peak = 0;    // most bytes live during a step, above the baseline
  double n = 0;       // parameters
};

// Builds the model in `mode`, takes one step (creating the optimizer state), then
// measures a second one.
Measured measure(parallel::Sharding mode) {
  auto& comm = world();
  const std::size_t before = tensor::host_memory_stats().live_bytes;
  Measured m;
  {
    auto model = make_model();
    for (const auto& named : model->named_parameters()) m.n += static_cast<double>(named.param->data.numel());
    std::unique_ptr<parallel::DistributedDataParallel> ddp;
    std::unique_ptr<nn::Optimizer> optimizer;
    std::unique_ptr<parallel::ShardedModel> sharded;
    if (mode == parallel::Sharding::ddp) {
      ddp = std::make_unique<parallel::DistributedDataParallel>(*model, comm,
                                                                parallel::DdpOptions{.bucket_bytes = kBucketBytes});
      optimizer = adamw(model->named_parameters());
    } else {
      sharded = std::make_unique<parallel::ShardedModel>(mode, *model, comm, adamw, kBucketBytes);
    }
    tensor::Generator gen(17 + static_cast<std::uint64_t>(comm.rank()));
    const Tensor inputs = tensor::uniform({kBatch, kWidth}, -1, 1, gen);
    const Tensor targets = Tensor::from_vector(std::vector<std::int64_t>(kBatch, 1));
    nn::CrossEntropyLoss loss_fn;
    const auto step = [&] {
      auto grad = [&](double s) { return loss_fn.backward(s); };
      if (ddp) {
        loss_fn.forward(ddp->forward(inputs), targets);
        ddp->optimizer_step_with_gradient_accumulation(*optimizer, grad, 1, 1);
      } else {
        loss_fn.forward(sharded->forward(inputs), targets);
        sharded->optimizer_step_with_gradient_accumulation(grad, 1, 1);
      }
    };
    step();
    tensor::reset_host_memory_peak();
    step();
    const auto stats = tensor::host_memory_stats();
    m.steady = static_cast<double>(stats.live_bytes - before);
    m.peak = static_cast<double>(stats.peak_bytes - before);
  }
  return m;
}

TEST(MemoryFormula, EveryModeHoldsWhatTheZeroFormulaSays) {
  const double w = world().size();
  const double unit = 4.0 * kWidth * (kWidth + 1);  // one Linear's parameters, f32
  for (parallel::Sharding mode :
       {parallel::Sharding::ddp, parallel::Sharding::zero1, parallel::Sharding::zero2, parallel::Sharding::fsdp}) {
    const Measured m = measure(mode);
    const double n = m.n;
    double formula = 0, allowance = 0;  // bytes the formula gives; buffers on top of it
    switch (mode) {
      case parallel::Sharding::ddp: formula = 16 * n; break;
      // OSS shares the updated parameters through a flat window of one bucket.
      case parallel::Sharding::zero1: formula = 8 * n + 8 * n / w, allowance = kBucketBytes; break;
      // FSDP's shard_grad_op: the flat gradients of the unit in backward and of the
      // one whose reduce-scatter is still in flight.
      case parallel::Sharding::zero2: formula = 4 * n + 12 * n / w, allowance = 2 * unit; break;
      // The unit in backward (its parameters and flat gradient) and the previous
      // unit's gradient, still being reduce-scattered (FsdpOptions' backward_post):
      // three units at most.
      case parallel::Sharding::fsdp: formula = 16 * n / w, allowance = 3 * unit; break;
    }
    if (world().rank() == 0) {
      std::printf("[ memory ] %-5s W=%g N=%.1fM: peak %.1f MB, after the step %.1f MB; formula %.1f MB + %.1f MB\n",
                  parallel::sharding_name(mode), w, n / 1e6, m.peak / 1e6, m.steady / 1e6, formula / 1e6,
                  allowance / 1e6);
    }
    // Within 10% of the formula (plus the buffers the mode keeps while it runs) at the
    // peak, and never below the formula: a mode that holds less than the formula is
    // not keeping what it must.
    EXPECT_LE(m.peak, 1.1 * formula + allowance) << parallel::sharding_name(mode) << " at " << w << " ranks";
    EXPECT_GE(m.peak, 0.9 * formula) << parallel::sharding_name(mode) << " at " << w << " ranks";
  }
}

}  // namespace
}  // namespace troupe::train
