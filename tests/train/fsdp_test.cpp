// FSDP (FullyShardedDataParallel) under mpirun: it must train like plain DDP (with
// momentum, AdamW, accumulation, padding, nested units, clipping, a loss scale), hold
// about 16N/W bytes of model state per rank with Adam, and checkpoint full state dicts
// that are DDP's and load at another world size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "train_world.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/ddp.hpp"
#include "troupe/train/distributed_sampler.hpp"
#include "troupe/train/fsdp.hpp"
#include "troupe/train/grad_scaler.hpp"
#include "troupe/train/host_pool.hpp"
#include "troupe/train/master_weights.hpp"

namespace troupe::train {
namespace {

using testing::world;

constexpr std::int64_t kGlobalBatch = 48;  // divisible by 1, 2, 3 and 4 ranks (and W/2)
constexpr int kSteps = 20;
constexpr std::uint64_t kDataSeed = 7, kModelSeed = 3, kShuffleSeed = 11;

enum class Opt { sgd_momentum, adamw };
enum class Shape { mlp, odd, nested };

std::unique_ptr<nn::Optimizer> make_optimizer(Opt opt, std::vector<nn::NamedParameter> params) {
  if (opt == Opt::sgd_momentum) return std::make_unique<nn::SGD>(std::move(params), 0.1, 0.9);
  return std::make_unique<nn::AdamW>(std::move(params), 1e-2);
}
OptimizerFactory factory(Opt opt) {
  return [opt](std::vector<nn::NamedParameter> params) { return make_optimizer(opt, std::move(params)); };
}

// mlp: the shared 16-32-32-4 MLP. odd: 16-7-4, whose first Linear has 119 parameters
// (no world size above 1 divides it). nested: Linear(16, 32), ReLU,
// Sequential(Linear(32, 32), ReLU, Linear(32, 4)).
std::unique_ptr<nn::Sequential> make_model(Shape shape, std::uint64_t seed) {
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

FsdpOptions wrapping(Shape shape) {
  if (shape == Shape::mlp) return {.auto_wrap_policy = module_type_auto_wrap_policy<nn::Linear>()};
  if (shape == Shape::odd) return {.auto_wrap_policy = size_based_auto_wrap_policy(100)};  // "0" only
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
  GradScaler* scaler = nullptr;
  int poison_step = -1;
};

struct FsdpRun {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  nn::CrossEntropyLoss loss_fn;
  int steps_done = 0;
  double last_norm = -1;

  FsdpRun(collectives::Communicator& comm, Shape shape, Opt opt, std::uint64_t seed = kModelSeed,
          bool cpu_offload = false)
      : model(make_model(shape, seed + static_cast<std::uint64_t>(comm.rank()))) {
    FsdpOptions options = wrapping(shape);
    options.cpu_offload = cpu_offload;
    fsdp = std::make_unique<FullyShardedDataParallel>(*model, comm, factory(opt), options);
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
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<nn::Optimizer> opt;
  nn::CrossEntropyLoss loss_fn;
  int steps_done = 0;
  double last_norm = -1;

  DdpRun(Shape shape, Opt o)
      : model(make_model(shape, kModelSeed + static_cast<std::uint64_t>(world().rank()))),
        ddp(std::make_unique<DistributedDataParallel>(*model, world())),
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

struct Case {
  Shape shape;
  Opt opt;
  int micro;
  const char* name;
};

class FsdpMatchesDdp : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpMatchesDdp, After20Steps) {
  const Case c = GetParam();
  DdpRun want(c.shape, c.opt);
  FsdpRun got(world(), c.shape, c.opt);
  const auto start = got.params();
  Batches a(world()), b(world());
  for (int s = 0; s < kSteps; ++s) {
    want.step(a.next(), {.micro = c.micro});
    got.step(b.next(), {.micro = c.micro});
  }
  const auto final_params = got.params();
  const double diff = testing::max_relative_difference(final_params, testing::flat_parameters(*want.model));
  EXPECT_LE(diff, 1e-5) << c.name;
  EXPECT_GT(testing::max_relative_difference(final_params, start), 1e-3);  // it trained
  if (world().rank() == 0) std::printf("fsdp %s vs ddp: max relative difference %.3g\n", c.name, diff);
}

INSTANTIATE_TEST_SUITE_P(Cases, FsdpMatchesDdp,
                         ::testing::Values(Case{Shape::mlp, Opt::sgd_momentum, 1, "sgd_momentum"},
                                           Case{Shape::mlp, Opt::adamw, 1, "adamw"},
                                           Case{Shape::mlp, Opt::adamw, 2, "adamw_no_sync_accumulate"},
                                           Case{Shape::mlp, Opt::sgd_momentum, 3, "sgd_no_sync_accumulate"},
                                           Case{Shape::odd, Opt::adamw, 1, "padded_unit"},
                                           Case{Shape::nested, Opt::sgd_momentum, 2, "nested_units"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(FullyShardedDataParallel, PadsAUnitTheWorldSizeDoesNotDivideAndKeepsTheRestInTheRootUnit) {
  FsdpRun run(world(), Shape::odd, Opt::adamw);
  const auto& f = *run.fsdp;
  ASSERT_EQ(f.unit_paths(), (std::vector<std::string>{"0", ""}));
  EXPECT_EQ(f.unit_parameter_names("0"), (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_EQ(f.unit_parameter_names(""), (std::vector<std::string>{"2.weight", "2.bias"}));
  const std::int64_t w = world().size();
  EXPECT_EQ(f.unit_numel("0"), 119);
  EXPECT_EQ(f.unit_padded_numel("0"), (119 + w - 1) / w * w);
  EXPECT_EQ(f.unit_padded_numel("0") % w, 0);
  EXPECT_EQ(f.shard_parameter_bytes(), static_cast<std::size_t>((f.unit_padded_numel("0") + f.unit_padded_numel("")) / w * 4));
  EXPECT_THROW(f.unit_numel("1"), InvalidArgument);
}

TEST(FullyShardedDataParallel, AWrapPolicyThatWrapsNothingIsAClearError) {
  auto model = testing::make_mlp(kModelSeed);
  try {
    FullyShardedDataParallel f(*model, world(), factory(Opt::adamw),
                               {.auto_wrap_policy = size_based_auto_wrap_policy(1'000'000)});
    ADD_FAILURE() << "a policy that wraps nothing was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("wrapped nothing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1056 parameters"), std::string::npos) << e.what();
  }
  EXPECT_THROW(FullyShardedDataParallel(*model, world(), factory(Opt::adamw),
                                        {.auto_wrap_policy = module_type_auto_wrap_policy<nn::Embedding>()}),
               InvalidArgument);
  EXPECT_THROW(FullyShardedDataParallel(*model, world(), factory(Opt::adamw), {.wrap = {"7"}}), InvalidArgument);
  EXPECT_THROW(size_based_auto_wrap_policy(0), InvalidArgument);
}

// Three units used in order: forward gathers the first on demand and prefetches the
// other two; backward the same in reverse. One reduce-scatter per unit.
TEST(FullyShardedDataParallel, PrefetchesTheNextUnitsAllGather) {
  FsdpRun run(world(), Shape::mlp, Opt::sgd_momentum);
  EXPECT_EQ(run.fsdp->unit_paths(), (std::vector<std::string>{"0", "2", "4"}));
  Batches batches(world());
  run.step(batches.next());
  const FsdpStats s = run.fsdp->stats();
  EXPECT_EQ(s.gathers, 6);
  EXPECT_EQ(s.prefetched, 4);
  EXPECT_EQ(s.reduce_scatters, 3);
  // Between steps nothing is gathered and the module's own tensors are gone.
  for (const auto& [name, p] : run.model->named_parameters()) EXPECT_FALSE(p->data.defined()) << name;
}

// AdamW in f32: 4 bytes of parameter + 4 of gradient + 8 of moments per element, over
// 1/W of the model: 16N/W (plus padding: a unit of 4160 elements at 3 ranks pads 1).
TEST(FullyShardedDataParallel, HoldsAbout16NOverWBytesPerRankWithAdam) {
  auto& comm = world();
  for (bool prefetch : {true, false}) {
    tensor::Generator gen(5);
    nn::Sequential model;
    for (int i = 0; i < 8; ++i) model.emplace<nn::Linear>(64, 64, gen);
    const std::int64_t n = model.parameter_count();
    FullyShardedDataParallel f(model, comm, factory(Opt::adamw),
                               {.auto_wrap_policy = module_type_auto_wrap_policy<nn::Linear>(), .prefetch = prefetch});
    nn::MSELoss loss;
    tensor::Generator data(6);
    const Tensor x = tensor::uniform({8, 64}, -1, 1, data);
    loss.forward(f.forward(x), tensor::uniform({8, 64}, -1, 1, data));
    f.backward(loss.backward());
    f.step();
    const std::size_t resident = f.shard_parameter_bytes() + f.shard_gradient_bytes() + f.optimizer_state_bytes();
    const double formula = 16.0 * static_cast<double>(n) / comm.size();
    EXPECT_NEAR(static_cast<double>(resident), formula, 0.1 * formula);
    // While running, with prefetch: at most two units' parameters (current +
    // prefetched) and two units' full gradients (current + the one whose reduce-scatter
    // is in flight); without: one unit's parameters and two units' gradients.
    const auto unit_bytes = static_cast<std::size_t>(f.unit_padded_numel("0")) * 4;
    EXPECT_LE(f.stats().peak_gathered_bytes, (prefetch ? 4 : 3) * unit_bytes);
    EXPECT_GE(f.stats().peak_gathered_bytes, (prefetch ? 4 : 3) * unit_bytes);  // reached: 8 units
    EXPECT_EQ(f.stats().prefetched, prefetch ? 14 : 0);
    if (comm.rank() == 0)
      std::printf("fsdp adam at %d ranks, prefetch %d: %zu B resident per rank, 16N/W = %.0f B, peak gathered %zu B "
                  "(unit %zu B)\n",
                  comm.size(), prefetch ? 1 : 0, resident, formula, f.stats().peak_gathered_bytes, unit_bytes);
  }
}

TEST(FullyShardedDataParallel, NoSyncKeepsFullLocalGradientsUntilTheSynchronisingBackward) {
  FsdpRun run(world(), Shape::mlp, Opt::sgd_momentum);
  Batches batches(world());
  const TensorBatch b = batches.next();
  run.loss_fn.forward(run.fsdp->forward(b.inputs), b.targets);
  {
    auto guard = run.fsdp->no_sync();
    run.fsdp->backward(run.loss_fn.backward());
  }
  std::int64_t padded = 0;  // the whole model, padded per unit to a multiple of W
  for (const auto& path : run.fsdp->unit_paths()) padded += run.fsdp->unit_padded_numel(path);
  EXPECT_GE(padded, 16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4);
  EXPECT_LT(padded, 16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4 + 3 * world().size());
  EXPECT_EQ(run.fsdp->local_full_gradient_bytes(), static_cast<std::size_t>(padded) * 4);
  EXPECT_EQ(run.fsdp->stats().reduce_scatters, 0);
  EXPECT_EQ(run.fsdp->shard_gradient_bytes(), 0u);
  run.loss_fn.forward(run.fsdp->forward(b.inputs), b.targets);
  run.fsdp->backward(run.loss_fn.backward());
  EXPECT_EQ(run.fsdp->local_full_gradient_bytes(), 0u);
  EXPECT_EQ(run.fsdp->shard_gradient_bytes(), run.fsdp->shard_parameter_bytes());
}

TEST(FullyShardedDataParallel, ClipGradNormIsTheGlobalNorm) {
  DdpRun want(Shape::mlp, Opt::sgd_momentum);
  FsdpRun got(world(), Shape::mlp, Opt::sgd_momentum);
  Batches a(world()), b(world());
  int clipped = 0;
  for (int s = 0; s < 10; ++s) {
    want.step(a.next(), {.clip = 0.2});
    got.step(b.next(), {.clip = 0.2});
    EXPECT_NEAR(got.last_norm, want.last_norm, 1e-5 * want.last_norm) << "step " << s;
    clipped += want.last_norm > 0.2 ? 1 : 0;
  }
  EXPECT_GT(clipped, 0);
  EXPECT_LE(testing::max_relative_difference(got.params(), testing::flat_parameters(*want.model)), 1e-5);
}

// An inf in the last rank's shard only: the scaler's all-reduced verdict skips the step
// everywhere, as DDP (whose averaged gradient is inf on every rank) does.
TEST(FullyShardedDataParallel, GradScalerSkipsTheStepOnEveryRankWhenAnyShardOverflows) {
  auto& comm = world();
  GradScaler s1(&comm, {.init_scale = 1024, .growth_interval = 4}), s2(&comm, {.init_scale = 1024, .growth_interval = 4});
  DdpRun want(Shape::mlp, Opt::adamw);
  FsdpRun got(comm, Shape::mlp, Opt::adamw);
  Batches a(comm), b(comm);
  for (int s = 0; s < 10; ++s) {
    want.step(a.next(), {.scaler = &s1, .poison_step = 3});
    got.step(b.next(), {.scaler = &s2, .poison_step = 3});
  }
  EXPECT_EQ(s2.skipped_steps(), 1);
  EXPECT_EQ(got.fsdp->optimizer().step_count(), 9);
  EXPECT_LE(testing::max_relative_difference(got.params(), testing::flat_parameters(*want.model)), 1e-5);
}

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
// dicts takes the next 5 steps like the run that never stopped.
TEST(FullyShardedDataParallel, LoadFullStateDictAtAnotherWorldSizeContinues) {
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
}

// CPU offload: the shards, their gradients and AdamW's moments live in the host pool
// and the step runs there. Same arithmetic as without offload (bit for bit), and the
// copies are really made and counted: per step the shards go to the compute side twice
// (the forward and the backward gathers) and the reduced gradient blocks come back once.
TEST(FullyShardedDataParallel, CpuOffloadKeepsShardsGradientsAndOptimizerStateInTheHostPool) {
  FsdpRun plain(world(), Shape::odd, Opt::adamw);
  FsdpRun offload(world(), Shape::odd, Opt::adamw, kModelSeed, /*cpu_offload=*/true);
  EXPECT_EQ(plain.fsdp->host_pool(), nullptr);
  ASSERT_NE(offload.fsdp->host_pool(), nullptr);
  Batches a(world()), b(world());
  for (int s = 0; s < kSteps; ++s) {
    plain.step(a.next());
    offload.step(b.next());
  }
  EXPECT_EQ(offload.params(), plain.params());
  EXPECT_EQ(plain.fsdp->stats().offload_bytes_to_device, 0u);

  // One more backward, kept: the gradients are there to look at.
  const TensorBatch batch = b.next();
  offload.loss_fn.forward(offload.fsdp->forward(batch.inputs), batch.targets);
  offload.fsdp->backward(offload.loss_fn.backward());
  const HostPool& pool = *offload.fsdp->host_pool();
  for (const auto& [name, p] : offload.fsdp->optimizer().named_parameters()) {
    EXPECT_TRUE(pool.owns(p->data)) << name;
    EXPECT_TRUE(pool.owns(p->grad)) << name;
  }
  const std::size_t shard = offload.fsdp->shard_parameter_bytes();
  // Parameters + gradients + AdamW's exp_avg and exp_avg_sq: four shard-sized tensors.
  EXPECT_EQ(pool.bytes(), 4 * shard);
  const FsdpStats& st = offload.fsdp->stats();
  EXPECT_EQ(st.offload_bytes_to_device, 2 * shard);
  EXPECT_EQ(st.offload_bytes_to_host, shard);
  EXPECT_GT(st.offload_seconds, 0.0);
  if (world().rank() == 0)
    std::printf("cpu offload: pool %zu B (%zu B mapped, %zu B pinned), moved %zu B to device and %zu B back in %.1f us\n",
                pool.bytes(), pool.mapped_bytes(), pool.pinned_bytes(), st.offload_bytes_to_device,
                st.offload_bytes_to_host, st.offload_seconds * 1e6);
}

// Mixed precision: a bf16 model with f32 master shards against DDP on the bf16 model
// with MasterWeights -- the same roundings (gradients reduced in bf16, combined in
// f32; widened; AdamW and the loss scale's unscale in f32; rounded into the model).
TEST(FullyShardedDataParallel, Bf16ModelWithF32MasterShardsTrainsLikeDdpWithMasterWeights) {
  auto& comm = world();
  const auto seed = kModelSeed + static_cast<std::uint64_t>(comm.rank());
  auto ddp_model = testing::make_mlp(seed);
  ddp_model->to(DType::bf16);
  DistributedDataParallel ddp(*ddp_model, comm);
  MasterWeights master(*ddp_model);
  nn::AdamW ddp_opt(master.named_parameters(), 1e-2);
  auto fsdp_model = testing::make_mlp(seed);
  fsdp_model->to(DType::bf16);
  FsdpOptions options = wrapping(Shape::mlp);
  options.master_dtype = DType::f32;
  FullyShardedDataParallel fsdp(*fsdp_model, comm, factory(Opt::adamw), options);
  for (const auto& [name, p] : fsdp.optimizer().named_parameters()) EXPECT_EQ(p->data.dtype(), DType::f32) << name;

  GradScaler s1(&comm, {.init_scale = 1024}), s2(&comm, {.init_scale = 1024});
  nn::CrossEntropyLoss l1, l2;
  Batches batches(comm);
  for (int s = 0; s < kSteps; ++s) {
    const TensorBatch b = batches.next();
    const Tensor x = b.inputs.to(DType::bf16);
    l1.forward(ddp.forward(x), b.targets);
    ddp.backward(l1.backward(s1.scale()));
    master.copy_gradients_to_master();
    s1.step(ddp_opt);
    s1.update();
    master.copy_master_to_model();
    ddp_opt.zero_grad();
    ddp_model->zero_grad();

    l2.forward(fsdp.forward(x), b.targets);
    fsdp.backward(l2.backward(s2.scale()));
    fsdp.step(s2);
    s2.update();
    fsdp.zero_grad();
  }
  EXPECT_EQ(s2.skipped_steps(), s1.skipped_steps());
  const nn::StateDict got = fsdp.full_state_dict();
  std::vector<double> values;
  for (const auto& [name, value] : got) {
    EXPECT_EQ(value.dtype(), DType::bf16) << name;  // the model's dtype, as DDP's checkpoint
    const auto v = value.to_vector<double>();
    values.insert(values.end(), v.begin(), v.end());
  }
  const auto want = testing::flat_parameters(*ddp_model);
  ASSERT_EQ(values.size(), want.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(values[i] - want[i]));
  EXPECT_LT(worst, 2e-2);  // measured: 0 at 1 to 4 ranks
  auto start = testing::make_mlp(kModelSeed);
  EXPECT_GT(testing::max_relative_difference(values, testing::flat_parameters(*start)), 1e-2);  // it trained
  if (comm.rank() == 0) std::printf("fsdp bf16 + f32 master shards vs ddp + MasterWeights: max |diff| %.3g\n", worst);
  const nn::StateDict optim = fsdp.full_optimizer_state_dict();
  EXPECT_EQ(optim.keys(), ddp_opt.state_dict().keys());
  EXPECT_EQ(optim.at("0.weight/exp_avg").dtype(), DType::f32);
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
  EXPECT_EQ(testing::max_relative_difference(run.params(), [&] {
              std::vector<double> v;
              for (const auto& [key, value] : good) {
                const auto x = value.to_vector<double>();
                v.insert(v.end(), x.begin(), x.end());
              }
              return v;
            }()),
            0.0);
}

}  // namespace
}  // namespace troupe::train
