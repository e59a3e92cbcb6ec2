// The harness of the sharding tests (sharding_test.cpp, oss_test.cpp): one model,
// data and optimizer setup trained in ddp, zero1 (DDP + OSS) or zero2
// (ShardedDataParallel + OSS) mode, so that every mode can be compared with DDP.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "train_world.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/grad_scaler.hpp"
#include "troupe/parallel/oss.hpp"
#include "troupe/parallel/sharded_ddp.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/distributed_sampler.hpp"

namespace troupe::train {
namespace {

using testing::world;

constexpr std::int64_t kGlobalBatch = 64;
constexpr int kSteps = 20;
constexpr std::uint64_t kDataSeed = 7, kModelSeed = 3, kShuffleSeed = 11;
constexpr std::size_t kBucketBytes = 5000;  // splits the test MLP into several buckets

enum class Mode { ddp, zero1, zero2 };
enum class Opt { sgd_momentum, adamw };

inline const char* mode_name(Mode m) { return m == Mode::ddp ? "ddp" : m == Mode::zero1 ? "zero1" : "zero2"; }

inline std::unique_ptr<nn::Optimizer> make_optimizer(Opt opt, std::vector<nn::NamedParameter> params) {
  if (opt == Opt::sgd_momentum) return std::make_unique<nn::SGD>(std::move(params), 0.1, 0.9);
  return std::make_unique<nn::AdamW>(std::move(params), 1e-2);
}
inline parallel::OptimizerFactory factory(Opt opt) {
  return [opt](std::vector<nn::NamedParameter> params) { return make_optimizer(opt, std::move(params)); };
}

// One data-parallel training setup in any mode: the model (rank-dependent seed, fixed
// by the broadcast from rank 0), its wrapper and its optimizer.
struct Trainer {
  Mode mode;
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<nn::Optimizer> plain;                    // ddp
  std::unique_ptr<parallel::OSS> oss;                      // zero1, zero2
  std::unique_ptr<parallel::DistributedDataParallel> ddp;  // ddp, zero1
  std::unique_ptr<parallel::ShardedDataParallel> sdp;      // zero2
  nn::CrossEntropyLoss loss_fn;
  double clip = 0;  // max grad norm; 0: no clipping
  double last_norm = -1;
  std::unique_ptr<parallel::GradScaler> scaler;
  int poison_step = -1;  // at this step an inf lands in `victim`'s gradient, on its owner only
  std::string victim;
  int steps_done = 0;

  Trainer(Mode m, Opt opt, std::uint64_t model_seed = kModelSeed,
          parallel::ShardedDdpOptions::Reduction reduction = parallel::ShardedDdpOptions{}.reduction)
      : mode(m) {
    auto& comm = world();
    model = testing::make_mlp(model_seed + static_cast<std::uint64_t>(comm.rank()));
    if (mode == Mode::zero2) {
      oss = std::make_unique<parallel::OSS>(model->named_parameters(), comm, factory(opt));
      sdp = std::make_unique<parallel::ShardedDataParallel>(
          *model, *oss, comm, parallel::ShardedDdpOptions{.bucket_bytes = kBucketBytes, .reduction = reduction});
    } else {
      ddp = std::make_unique<parallel::DistributedDataParallel>(*model, comm,
                                                                parallel::DdpOptions{.bucket_bytes = kBucketBytes});
      if (mode == Mode::zero1)
        oss = std::make_unique<parallel::OSS>(model->named_parameters(), comm, factory(opt));
      else
        plain = make_optimizer(opt, model->named_parameters());
    }
  }

  // One optimizer step over `batch` (this rank's share), in `micro` micro-batches
  // accumulated under no_sync.
  void step(const TensorBatch& batch, int micro = 1) {
    const std::int64_t rows = batch.inputs.size(0) / micro;
    for (int m = 0; m < micro; ++m) {
      const Tensor x = batch.inputs.slice(m * rows, (m + 1) * rows);
      const Tensor y = batch.targets.slice(m * rows, (m + 1) * rows);
      loss_fn.forward(model->forward(x), y);
      const Tensor g = loss_fn.backward((scaler ? scaler->scale() : 1.0) / micro);
      if (m + 1 < micro) {
        if (sdp) {
          auto guard = sdp->no_sync();
          sdp->backward(g);
        } else {
          auto guard = ddp->no_sync();
          ddp->backward(g);
        }
      } else if (sdp) {
        sdp->backward(g);
      } else {
        ddp->backward(g);
      }
    }
    if (steps_done++ == poison_step)
      for (const auto& [name, p] : model->named_parameters())
        if (name == victim && (!oss || oss->owns(name))) p->grad.data<float>()[0] = INFINITY;
    if (clip > 0) last_norm = oss ? oss->clip_grad_norm(clip) : nn::clip_grad_norm(model->named_parameters(), clip);
    if (scaler) {
      if (oss)
        oss->step(*scaler);
      else
        scaler->step(*plain);
      scaler->update();
      if (oss)
        oss->zero_grad();
      else
        plain->zero_grad();
    } else if (oss) {
      oss->step();
      oss->zero_grad();
    } else {
      plain->step();
      plain->zero_grad();
    }
  }
};

// The global batches of steps [first, first + count): the same on every run.
struct Batches {
  TensorDataset data = testing::make_data(kGlobalBatch * kSteps, kDataSeed);
  DistributedSampler sampler{data.size(), world().size(), world().rank(), {.shuffle = true, .seed = kShuffleSeed}};
  std::int64_t local = kGlobalBatch / world().size();
  explicit Batches(int skip = 0) {
    for (int s = 0; s < skip; ++s) sampler.take(local);
  }
  TensorBatch next() { return data.rows(sampler.take(local)); }
};

struct RunResult {
  std::vector<double> params;
  int steps_identical_on_every_rank = 0;
};

inline RunResult train(Mode mode, Opt opt, int steps, int micro = 1) {
  Trainer trainer(mode, opt);
  Batches batches;
  RunResult result;
  for (int s = 0; s < steps; ++s) {
    trainer.step(batches.next(), micro);
    result.steps_identical_on_every_rank += testing::same_on_every_rank(testing::parameter_hash(*trainer.model));
  }
  result.params = testing::flat_parameters(*trainer.model);
  return result;
}

inline std::int64_t all_sum(std::int64_t v) {
  if (world().size() > 1) world().allreduce(collectives::Buffer(&v, 1), collectives::ReduceOp::sum);
  return v;
}
inline std::int64_t all_max(std::int64_t v) {
  if (world().size() > 1) world().allreduce(collectives::Buffer(&v, 1), collectives::ReduceOp::max);
  return v;
}

}  // namespace
}  // namespace troupe::train
