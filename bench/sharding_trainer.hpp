// sharding_bench's models and trainer: the models it measures (MLPs, GPT-2 small), one
// training step in each sharding mode behind one interface, the per-rank byte counts,
// and the ZeRO formulas they are compared with. See sharding_bench.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/fsdp.hpp"
#include "troupe/parallel/oss.hpp"
#include "troupe/parallel/sharded_model.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::sharding_bench {

using tensor::DType;
using tensor::Tensor;

inline constexpr double kLr = 1e-3;
inline constexpr std::size_t kBucketBytes = std::size_t{25} << 20;

inline constexpr std::int64_t kGptTokens = 128;  // per rank and step, one sequence

inline bool is_gpt(const std::string& model) { return model == "gpt124m"; }

inline nn::GPTConfig gpt_config() {
  return {.block_size = 1024, .vocab_size = 50257, .n_layer = 12, .n_head = 12, .n_embd = 768};
}

inline std::vector<std::int64_t> widths_of(const std::string& model) {
  if (model == "mlp25m") return {1024, 4096, 4096, 1024};
  if (model == "deep67m") return std::vector<std::int64_t>(17, 2048);
  throw InvalidArgument("sharding_bench: unknown model " + model + " (mlp25m, deep67m, gpt124m)");
}

inline std::int64_t max_over_ranks(collectives::Communicator& comm, std::int64_t v) {
  if (comm.size() > 1) comm.allreduce(collectives::Buffer(&v, 1), collectives::ReduceOp::max);
  return v;
}

inline std::size_t slot_bytes(const nn::StateDict& dict) {
  std::size_t n = 0;
  for (const auto& [key, value] : dict)
    if (key.find('/') != std::string::npos) n += value.nbytes();
  return n;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

// The mode's wrapper and optimizer, behind one step and one byte count.
struct Trainer {
  parallel::Sharding mode;
  nn::Module& model;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;    // ddp, zero1
  std::unique_ptr<nn::Optimizer> plain;                      // ddp
  std::unique_ptr<parallel::OSS> oss;                        // zero1
  std::unique_ptr<parallel::FullyShardedDataParallel> fsdp;  // zero2 (shard_grad_op), fsdp (full_shard)

  Trainer(parallel::Sharding m, nn::Module& mdl, collectives::Communicator& comm,
          parallel::FsdpOptions::BackwardPrefetch backward_prefetch)
      : mode(m), model(mdl) {
    const parallel::OptimizerFactory adamw = [](std::vector<nn::NamedParameter> params) {
      return std::make_unique<nn::AdamW>(std::move(params), kLr);
    };
    switch (mode) {
      case parallel::Sharding::ddp:
        ddp = std::make_unique<parallel::DistributedDataParallel>(model, comm,
                                                                  parallel::DdpOptions{.bucket_bytes = kBucketBytes});
        plain = adamw(model.named_parameters());
        break;
      case parallel::Sharding::zero1:
        ddp = std::make_unique<parallel::DistributedDataParallel>(model, comm,
                                                                  parallel::DdpOptions{.bucket_bytes = kBucketBytes});
        oss = std::make_unique<parallel::OSS>(model.named_parameters(), comm, adamw);
        break;
      case parallel::Sharding::zero2:
      case parallel::Sharding::fsdp:
        // As the worker group's ShardedModel builds them: one unit per Linear (an MLP) or
        // per Block (a GPT, as train_gpt wraps it).
        fsdp = std::make_unique<parallel::FullyShardedDataParallel>(
            model, comm, adamw,
            parallel::FsdpOptions{.auto_wrap_policy = dynamic_cast<nn::GPT*>(&model) != nullptr
                                                          ? parallel::module_type_auto_wrap_policy<nn::Block>()
                                                          : parallel::parameterised_leaf_auto_wrap_policy(),
                                  .sharding_strategy = mode == parallel::Sharding::zero2
                                                           ? parallel::FsdpOptions::ShardingStrategy::shard_grad_op
                                                           : parallel::FsdpOptions::ShardingStrategy::full_shard,
                                  .backward_prefetch = backward_prefetch});
        break;
    }
  }
  // The wrappers before the OSS they refer to.
  ~Trainer() {
    ddp.reset();
    fsdp.reset();
  }

  // Returns the loss.
  double forward_backward(nn::CrossEntropyLoss& loss_fn, const Tensor& x, const Tensor& y) {
    const Tensor out = fsdp ? fsdp->forward(x) : ddp->forward(x);
    const bool tokens = out.dim() == 3;  // a GPT's [B, T, V] logits
    const double loss = loss_fn.forward(tokens ? out.reshape({-1, out.size(-1)}) : out, y).item();
    const Tensor grad = tokens ? loss_fn.backward().reshape(out.shape()) : loss_fn.backward();
    if (fsdp)
      fsdp->backward(grad);
    else
      ddp->backward(grad);
    return loss;
  }
  void step_and_zero() {
    if (fsdp) {
      fsdp->step();
      fsdp->zero_grad(true);
    } else if (oss) {
      oss->step();  // steps the owned partition, then shares the parameters
      oss->zero_grad(true);
    } else {
      plain->step();
      plain->zero_grad(true);
    }
  }

  struct Bytes {
    std::size_t parameters = 0, gradients = 0, optimizer = 0;
  };
  // After a backward: see the header comment for what each mode counts.
  Bytes bytes() const {
    Bytes b;
    if (fsdp) {
      b.parameters = fsdp->parameter_bytes();
      b.gradients = fsdp->shard_gradient_bytes() + fsdp->local_full_gradient_bytes();
      b.optimizer = fsdp->optimizer_state_bytes();
      return b;
    }
    for (const auto& [name, p] : model.named_parameters()) {
      b.parameters += p->data.nbytes();
      if (p->grad.defined()) b.gradients += p->grad.nbytes();
    }
    b.optimizer = oss ? oss->local_state_bytes() : slot_bytes(plain->state_dict());
    return b;
  }
};

// The ZeRO formula for Adam in f32 (bytes per rank): N parameters, W ranks.
inline double formula_bytes(parallel::Sharding mode, double n, double w) {
  switch (mode) {
    case parallel::Sharding::ddp: return 16 * n;
    case parallel::Sharding::zero1: return 8 * n + 8 * n / w;
    case parallel::Sharding::zero2: return 4 * n + 12 * n / w;
    case parallel::Sharding::fsdp: return 16 * n / w;
  }
  return 0;
}

inline const char* formula_text(parallel::Sharding mode) {
  switch (mode) {
    case parallel::Sharding::ddp: return "16N";
    case parallel::Sharding::zero1: return "8N + 8N/W";
    case parallel::Sharding::zero2: return "4N + 12N/W";
    case parallel::Sharding::fsdp: return "16N/W";
  }
  return "?";
}

inline std::unique_ptr<nn::Module> build_model(const std::string& name, tensor::Device device) {
  if (is_gpt(name)) return std::make_unique<nn::GPT>(gpt_config(), 0, DType::f32, device);
  const auto widths = widths_of(name);
  tensor::Generator gen(0);
  auto model = std::make_unique<nn::Sequential>();
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    model->emplace<nn::Linear>(widths[l], widths[l + 1], gen, true, DType::f32, device);
    if (l + 2 < widths.size()) model->emplace<nn::ReLU>();
  }
  return model;
}

}  // namespace troupe::sharding_bench
