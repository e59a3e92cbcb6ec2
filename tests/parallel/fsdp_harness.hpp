// What the FSDP tests share: models (plain, padded, nested), their wrapping, the
// global batches at any world size, and one training step for FSDP and for the DDP
// reference, with accumulation, clipping, a loss scale and an injected inf.
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include "train_world.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/fsdp.hpp"
#include "troupe/parallel/grad_scaler.hpp"
#include "troupe/parallel/master_weights.hpp"
#include "troupe/parallel/offload_memory.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/distributed_sampler.hpp"

namespace troupe::train::fsdp_testing {

using testing::world;

constexpr std::int64_t kGlobalBatch = 48;  // divisible by 1, 2, 3 and 4 ranks (and W/2)
constexpr int kSteps = 20;
constexpr std::uint64_t kDataSeed = 7, kModelSeed = 3, kShuffleSeed = 11;

enum class Opt { sgd_momentum, adamw };
enum class Shape { mlp, odd, nested };

inline std::unique_ptr<nn::Optimizer> make_optimizer(Opt opt, std::vector<nn::NamedParameter> params) {
  if (opt == Opt::sgd_momentum) return std::make_unique<nn::SGD>(std::move(params), 0.1, 0.9);
  return std::make_unique<nn::AdamW>(std::move(params), 1e-2);
}
inline parallel::OptimizerFactory factory(Opt opt) {
  return [opt](std::vector<nn::NamedParameter> params) { return make_optimizer(opt, std::move(params)); };
}

// mlp: the shared 16-32-32-4 MLP. odd: 16-7-4, whose first Linear has 119 parameters
// (no world size above 1 divides it). nested: Linear(16, 32), ReLU,
// Sequential(Linear(32, 32), ReLU, Linear(32, 4)).
inline std::unique_ptr<nn::Sequential> make_model(Shape shape, std::uint64_t seed) {
  if (shape == Shape::mlp) return testing::make_mlp(seed);
  tensor::Generator gen(seed);
  auto model = std::make_unique<nn::Sequential>();
  if (shape == Shape::odd) {
    model->emplace<nn::Linear>(16, 7, gen);
    model->emplace<nn::ReLU>();
    model->emplace<nn::Linear>(7, 4, gen);
    return model;
  }
  model->emplace<nn::Linear>(16, 32, gen);
  model->emplace<nn::ReLU>();
  auto inner = std::make_shared<nn::Sequential>();
  inner->emplace<nn::Linear>(32, 32, gen);
  inner->emplace<nn::ReLU>();
  inner->emplace<nn::Linear>(32, 4, gen);
  model->add(inner);
  return model;
}

inline parallel::FsdpOptions wrapping(Shape shape) {
  if (shape == Shape::mlp) return {.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Linear>()};
  if (shape == Shape::odd) return {.auto_wrap_policy = parallel::size_based_auto_wrap_policy(100)};  // "0" only
  return {.wrap = {"2", "2.0"}};
}

// The global batches, for a communicator of any size: R ranks x batch B see the samples
// of one rank x batch R*B, so runs at different world sizes see the same data.
struct Batches {
  TensorDataset data = testing::make_data(kGlobalBatch * kSteps, kDataSeed);
  DistributedSampler sampler;
  std::int64_t local;
  explicit Batches(collectives::Communicator& comm, int skip = 0)
      : sampler(data.size(), comm.size(), comm.rank(), {.shuffle = true, .seed = kShuffleSeed}),
        local(kGlobalBatch / comm.size()) {
    for (int s = 0; s < skip; ++s) sampler.take(local);
  }
  TensorBatch next() { return data.rows(sampler.take(local)); }
};

// One step in `micro` micro-batches, the first ones under no_sync; with `clip`,
// `scaler`, and an inf planted in the gradient (by `poison`) at step `poison_step`.
struct Options {
  int micro = 1;
  double clip = 0;
  parallel::GradScaler* scaler = nullptr;
  int poison_step = -1;
};

struct FsdpRun {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<parallel::FullyShardedDataParallel> fsdp;
  nn::CrossEntropyLoss loss_fn;
  int steps_done = 0;
  double last_norm = -1;

  FsdpRun(collectives::Communicator& comm, Shape shape, Opt opt, std::uint64_t seed = kModelSeed,
          bool cpu_offload = false,
          parallel::FsdpOptions::ShardingStrategy strategy = parallel::FsdpOptions::ShardingStrategy::full_shard)
      : model(make_model(shape, seed + static_cast<std::uint64_t>(comm.rank()))) {
    parallel::FsdpOptions options = wrapping(shape);
    options.cpu_offload = cpu_offload;
    options.sharding_strategy = strategy;
    fsdp = std::make_unique<parallel::FullyShardedDataParallel>(*model, comm, factory(opt), options);
  }

  void step(const TensorBatch& batch, const Options& o = {}) {
    const std::int64_t rows = batch.inputs.size(0) / o.micro;
    const double scale = o.scaler ? o.scaler->scale() : 1.0;
    for (int m = 0; m < o.micro; ++m) {
      loss_fn.forward(fsdp->forward(batch.inputs.slice(m * rows, (m + 1) * rows)),
                      batch.targets.slice(m * rows, (m + 1) * rows));
      const Tensor g = loss_fn.backward(scale / o.micro);
      if (m + 1 < o.micro) {
        auto guard = fsdp->no_sync();
        fsdp->backward(g);
      } else {
        fsdp->backward(g);
      }
    }
    if (steps_done++ == o.poison_step && world().rank() == world().size() - 1)
      fsdp->optimizer().named_parameters().back().param->grad.data<float>()[0] = INFINITY;
    if (o.clip > 0) last_norm = fsdp->clip_grad_norm(o.clip);
    if (o.scaler) {
      fsdp->step(*o.scaler);
      o.scaler->update();
    } else {
      fsdp->step();
    }
    fsdp->zero_grad();
  }
  std::vector<double> params() {
    std::vector<double> out;
    for (const auto& [name, value] : fsdp->full_state_dict()) {
      const auto v = value.to_vector<double>();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }
};

struct DdpRun {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  std::unique_ptr<nn::Optimizer> opt;
  nn::CrossEntropyLoss loss_fn;
  int steps_done = 0;
  double last_norm = -1;

  DdpRun(Shape shape, Opt o)
      : model(make_model(shape, kModelSeed + static_cast<std::uint64_t>(world().rank()))),
        ddp(std::make_unique<parallel::DistributedDataParallel>(*model, world())),
        opt(make_optimizer(o, model->named_parameters())) {}

  void step(const TensorBatch& batch, const Options& o = {}) {
    const std::int64_t rows = batch.inputs.size(0) / o.micro;
    const double scale = o.scaler ? o.scaler->scale() : 1.0;
    for (int m = 0; m < o.micro; ++m) {
      loss_fn.forward(ddp->forward(batch.inputs.slice(m * rows, (m + 1) * rows)),
                      batch.targets.slice(m * rows, (m + 1) * rows));
      const Tensor g = loss_fn.backward(scale / o.micro);
      if (m + 1 < o.micro) {
        auto guard = ddp->no_sync();
        ddp->backward(g);
      } else {
        ddp->backward(g);
      }
    }
    if (steps_done++ == o.poison_step) model->named_parameters().back().param->grad.data<float>()[0] = INFINITY;
    if (o.clip > 0) last_norm = nn::clip_grad_norm(model->named_parameters(), o.clip);
    if (o.scaler) {
      o.scaler->step(*opt);
      o.scaler->update();
    } else {
      opt->step();
    }
    opt->zero_grad();
  }
};

}  // namespace troupe::train::fsdp_testing
