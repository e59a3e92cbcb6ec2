// FSDP (FullyShardedDataParallel) under mpirun: it must train like plain DDP (with
// momentum, AdamW, accumulation, padding, nested units, clipping, a loss scale, a bf16
// model with f32 master shards, CPU offload), prefetch, and hold about 16N/W bytes of
// model state per rank with Adam. State dicts: fsdp_state_dict_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "fsdp_harness.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/layer_norm.hpp"

namespace troupe::train {
namespace {

using namespace fsdp_testing;
using testing::world;

using Strategy = parallel::FsdpOptions::ShardingStrategy;

struct Case {
  Shape shape;
  Opt opt;
  int micro;
  const char* name;
  Strategy strategy = Strategy::full_shard;
};

class FsdpMatchesDdp : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpMatchesDdp, After20Steps) {
  const Case c = GetParam();
  DdpRun want(c.shape, c.opt);
  FsdpRun got(world(), c.shape, c.opt, kModelSeed, false, c.strategy);
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

INSTANTIATE_TEST_SUITE_P(
    Cases, FsdpMatchesDdp,
    ::testing::Values(Case{Shape::mlp, Opt::sgd_momentum, 1, "sgd_momentum"}, Case{Shape::mlp, Opt::adamw, 1, "adamw"},
                      Case{Shape::mlp, Opt::adamw, 2, "adamw_no_sync_accumulate"},
                      Case{Shape::mlp, Opt::sgd_momentum, 3, "sgd_no_sync_accumulate"},
                      Case{Shape::odd, Opt::adamw, 1, "padded_unit"},
                      Case{Shape::nested, Opt::sgd_momentum, 2, "nested_units"},
                      // ZeRO-2: gradients and optimizer state sharded only
                      Case{Shape::mlp, Opt::sgd_momentum, 1, "shard_grad_op_sgd_momentum", Strategy::shard_grad_op},
                      Case{Shape::mlp, Opt::adamw, 2, "shard_grad_op_adamw_accumulate", Strategy::shard_grad_op},
                      Case{Shape::odd, Opt::adamw, 1, "shard_grad_op_padded_unit", Strategy::shard_grad_op},
                      Case{Shape::nested, Opt::sgd_momentum, 2, "shard_grad_op_nested_units", Strategy::shard_grad_op}),
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
  EXPECT_EQ(f.shard_parameter_bytes(),
            static_cast<std::size_t>((f.unit_padded_numel("0") + f.unit_padded_numel("")) / w * 4));
  EXPECT_THROW(f.unit_numel("1"), InvalidArgument);
}

TEST(FullyShardedDataParallel, AWrapPolicyThatWrapsNothingIsAClearError) {
  auto model = testing::make_mlp(kModelSeed);
  try {
    parallel::FullyShardedDataParallel f(*model, world(), factory(Opt::adamw),
                                         {.auto_wrap_policy = parallel::size_based_auto_wrap_policy(1'000'000)});
    ADD_FAILURE() << "a policy that wraps nothing was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("wrapped nothing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1056 parameters"), std::string::npos) << e.what();
  }
  EXPECT_THROW(
      parallel::FullyShardedDataParallel(*model, world(), factory(Opt::adamw),
                                         {.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Embedding>()}),
      InvalidArgument);
  EXPECT_THROW(parallel::FullyShardedDataParallel(*model, world(), factory(Opt::adamw), {.wrap = {"7"}}),
               InvalidArgument);
  EXPECT_THROW(parallel::size_based_auto_wrap_policy(0), InvalidArgument);
}

// Embedding (index input, no input gradient) and LayerNorm (gradients written through
// raw pointers) also accumulate into the flat gradient views: Embedding(40, 16),
// LayerNorm(16), Linear(16, 4), each a unit, trains like DDP with AdamW.
// One cross-entropy step of the same batch through DDP (with its optimizer) and FSDP.
void step_both(parallel::DistributedDataParallel& ddp, nn::Optimizer& opt, parallel::FullyShardedDataParallel& fsdp,
               const Tensor& x, const Tensor& y) {
  nn::CrossEntropyLoss l1, l2;
  l1.forward(ddp.forward(x), y);
  ddp.backward(l1.backward());
  opt.step();
  opt.zero_grad();
  l2.forward(fsdp.forward(x), y);
  fsdp.backward(l2.backward());
  fsdp.step();
  fsdp.zero_grad();
}

TEST(FullyShardedDataParallel, EmbeddingAndLayerNormUnitsTrainLikeDdp) {
  auto& comm = world();
  auto build = [&] {
    tensor::Generator gen(kModelSeed + static_cast<std::uint64_t>(comm.rank()));
    auto m = std::make_unique<nn::Sequential>();
    m->emplace<nn::Embedding>(40, 16, gen);
    m->emplace<nn::LayerNorm>(16);
    m->emplace<nn::Linear>(16, 4, gen);
    return m;
  };
  auto ddp_model = build(), fsdp_model = build();
  parallel::DistributedDataParallel ddp(*ddp_model, comm);
  nn::AdamW opt(ddp_model->named_parameters(), 1e-2);
  parallel::FullyShardedDataParallel fsdp(
      *fsdp_model, comm, factory(Opt::adamw),
      {.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Embedding, nn::LayerNorm, nn::Linear>()});
  EXPECT_EQ(fsdp.unit_paths(), (std::vector<std::string>{"0", "1", "2"}));
  tensor::Generator data(17 + static_cast<std::uint64_t>(comm.rank()));
  for (int s = 0; s < 10; ++s) {
    std::vector<std::int64_t> ids, labels;
    for (float v : tensor::uniform({12}, 0, 40, data).to_vector<float>()) {
      ids.push_back(std::min<std::int64_t>(39, static_cast<std::int64_t>(v)));
      labels.push_back(ids.back() % 4);
    }
    step_both(ddp, opt, fsdp, Tensor::from_vector(ids), Tensor::from_vector(labels));
  }
  std::vector<double> got;
  for (const auto& [name, value] : fsdp.full_state_dict()) {
    const auto v = value.to_vector<double>();
    got.insert(got.end(), v.begin(), v.end());
  }
  EXPECT_LE(testing::max_relative_difference(got, testing::flat_parameters(*ddp_model)), 1e-5);
}

// A GPT runs its blocks itself: FSDP gathers each block from module hooks, keeps the
// root unit (embeddings, ln_f and the tied lm_head) gathered through forward and
// backward, and trains exactly as DDP does, in full_shard and in shard_grad_op. The
// tied weight is one flat entry; the full state dict lists it under both names.
// AdamW decays the matrices only, as nanoGPT configures it: the flat shards tell it
// which of their elements belong to a matrix (Parameter::segments), so the norms'
// weights, which start at 1 and would shrink by 2% under decay, stay as DDP's.
TEST(FullyShardedDataParallel, GptBlocksAsUnitsTrainLikeDdpWithTheTiedHead) {
  auto& comm = world();
  const nn::GPTConfig config{.block_size = 8, .vocab_size = 12, .n_layer = 2, .n_head = 2, .n_embd = 16};
  const auto adamw = [](std::vector<nn::NamedParameter> params) {
    auto opt = std::make_unique<nn::AdamW>(std::move(params), 1e-2, nn::Betas{}, 1e-8, 0.5);
    opt->set_weight_decay_filter(nn::decay_matrices_only);
    return opt;
  };
  for (const auto strategy :
       {parallel::FsdpOptions::ShardingStrategy::full_shard, parallel::FsdpOptions::ShardingStrategy::shard_grad_op}) {
    nn::GPT ddp_model(config, kModelSeed), fsdp_model(config, kModelSeed);
    parallel::DistributedDataParallel ddp(ddp_model, comm);
    const auto opt_owner = adamw(ddp_model.named_parameters());
    nn::Optimizer& opt = *opt_owner;
    parallel::FullyShardedDataParallel fsdp(
        fsdp_model, comm, adamw, {.wrap = {"transformer.h.0", "transformer.h.1"}, .sharding_strategy = strategy});
    EXPECT_EQ(fsdp.unit_paths(), (std::vector<std::string>{"", "transformer.h.0", "transformer.h.1"}));
    tensor::Generator data(17 + static_cast<std::uint64_t>(comm.rank()));
    for (int s = 0; s < 5; ++s) {
      std::vector<std::int64_t> inputs, targets;  // 3 windows of 9 tokens: 8 inputs, 8 next tokens
      const auto tokens = tensor::uniform({3 * 9}, 0, 12, data).to_vector<float>();
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        const auto id = std::min<std::int64_t>(11, static_cast<std::int64_t>(tokens[i]));
        if (i % 9 != 8) inputs.push_back(id);
        if (i % 9 != 0) targets.push_back(id);
      }
      step_both(ddp, opt, fsdp, Tensor::from_vector(inputs, {3, 8}), Tensor::from_vector(targets, {3, 8}));
    }
    const nn::StateDict full = fsdp.full_state_dict();
    EXPECT_EQ(full.keys(), ddp_model.state_dict().keys());
    EXPECT_EQ(full.at("lm_head.weight").to_vector<float>(), full.at("transformer.wte.weight").to_vector<float>());
    for (const auto& [name, value] : ddp_model.state_dict())
      EXPECT_LE(testing::max_relative_difference(full.at(name).to_vector<double>(), value.to_vector<double>()), 1e-5)
          << name;
  }
}

// A forward that throws (a wrongly shaped input, refused by the first unit's Linear
// after the second unit's gather was prefetched) or a backward that throws leaves
// nothing gathered or in flight, and training goes on as if it never happened.
TEST(FullyShardedDataParallel, AForwardOrBackwardThatThrowsLeavesNothingGathered) {
  DdpRun want(Shape::mlp, Opt::adamw);
  FsdpRun got(world(), Shape::mlp, Opt::adamw);
  Batches a(world()), b(world());
  want.step(a.next());
  got.step(b.next());
  EXPECT_THROW(got.fsdp->forward(Tensor::zeros({2, 15})), InvalidArgument);
  for (const auto& [name, p] : got.model->named_parameters()) EXPECT_FALSE(p->data.defined()) << name;
  // A backward given a wrongly shaped gradient: refused by the last unit's Linear.
  got.fsdp->forward(Tensor::zeros({2, 16}));
  EXPECT_THROW(got.fsdp->backward(Tensor::zeros({2, 5})), InvalidArgument);
  EXPECT_EQ(got.fsdp->local_full_gradient_bytes(), 0u);
  for (const auto& [name, p] : got.model->named_parameters())
    EXPECT_FALSE(p->data.defined() || p->grad.defined()) << name;
  got.fsdp->zero_grad();
  for (int s = 1; s < 5; ++s) {
    want.step(a.next());
    got.step(b.next());
  }
  EXPECT_LE(testing::max_relative_difference(got.params(), testing::flat_parameters(*want.model)), 1e-5);
}

// Three units used in order: forward gathers the first on demand and prefetches the
// other two; backward the same in reverse. One reduce-scatter per unit.
TEST(FullyShardedDataParallel, PrefetchesTheNextUnitsAllGather) {
  FsdpRun run(world(), Shape::mlp, Opt::sgd_momentum);
  EXPECT_EQ(run.fsdp->unit_paths(), (std::vector<std::string>{"0", "2", "4"}));
  Batches batches(world());
  run.step(batches.next());
  const parallel::FsdpStats s = run.fsdp->stats();
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
  using Prefetch = parallel::FsdpOptions::BackwardPrefetch;
  struct Case {
    bool prefetch;
    Prefetch backward;
    int peak_units;  // units' parameters and full gradients at once, at the peak
  };
  // backward_post: the unit in backward (parameters + gradient) and the previous
  // unit's gradient, still being reduce-scattered; backward_pre adds the next unit's
  // parameters, prefetched; without prefetch, backward_post's three.
  for (const Case c : {Case{true, Prefetch::backward_post, 3}, Case{true, Prefetch::backward_pre, 4},
                       Case{false, Prefetch::backward_post, 3}}) {
    tensor::Generator gen(5);
    nn::Sequential model;
    for (int i = 0; i < 8; ++i) model.emplace<nn::Linear>(64, 64, gen);
    const std::int64_t n = model.parameter_count();
    parallel::FullyShardedDataParallel f(model, comm, factory(Opt::adamw),
                                         {.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Linear>(),
                                          .prefetch = c.prefetch,
                                          .backward_prefetch = c.backward});
    nn::MSELoss loss;
    tensor::Generator data(6);
    const Tensor x = tensor::uniform({8, 64}, -1, 1, data);
    loss.forward(f.forward(x), tensor::uniform({8, 64}, -1, 1, data));
    f.backward(loss.backward());
    f.step();
    const std::size_t resident = f.shard_parameter_bytes() + f.shard_gradient_bytes() + f.optimizer_state_bytes();
    const double formula = 16.0 * static_cast<double>(n) / comm.size();
    EXPECT_NEAR(static_cast<double>(resident), formula, 0.1 * formula);
    const auto unit_bytes = static_cast<std::size_t>(f.unit_padded_numel("0")) * 4;
    EXPECT_EQ(f.stats().peak_gathered_bytes, c.peak_units * unit_bytes);  // reached and not passed: 8 units
    EXPECT_EQ(f.stats().prefetched, c.prefetch ? 14 : 0);
    if (comm.rank() == 0)
      std::printf(
          "fsdp adam at %d ranks, prefetch %d/%s: %zu B resident per rank, 16N/W = %.0f B, peak gathered "
          "%zu B (unit %zu B)\n",
          comm.size(), c.prefetch ? 1 : 0, c.backward == Prefetch::backward_pre ? "pre" : "post", resident, formula,
          f.stats().peak_gathered_bytes, unit_bytes);
  }
}

// shard_grad_op (ZeRO-2): the module keeps its full parameters (views into the flat
// buffers) between steps; forward and backward gather nothing until the optimizer has
// stepped, then each unit is gathered once, in place. AdamW: 4N + 12N/W bytes.
TEST(FullyShardedDataParallel, ShardGradOpKeepsTheFullParametersAndGathersOncePerStep) {
  auto& comm = world();
  const std::int64_t w = comm.size();
  FsdpRun run(comm, Shape::mlp, Opt::adamw, kModelSeed, false, Strategy::shard_grad_op);
  auto& f = *run.fsdp;
  const std::size_t units = f.unit_paths().size();
  std::int64_t padded = 0;
  for (const auto& path : f.unit_paths()) padded += f.unit_padded_numel(path);
  EXPECT_EQ(f.parameter_bytes(), static_cast<std::size_t>(padded) * 4);
  EXPECT_EQ(f.shard_parameter_bytes(), static_cast<std::size_t>(padded / w) * 4);  // views, counted above
  for (const auto& [name, p] : run.model->named_parameters()) EXPECT_TRUE(p->data.defined()) << name;

  Batches batches(comm);
  const TensorBatch b = batches.next();
  run.step(b);  // nothing stepped before it: nothing to gather
  EXPECT_EQ(f.stats().gathers, 0);
  EXPECT_EQ(f.stats().reduce_scatters, static_cast<int>(units));
  const std::int64_t n = run.model->parameter_count();
  const double formula = 4.0 * n + 12.0 * n / w;
  const std::size_t resident = f.parameter_bytes() + f.optimizer_state_bytes();  // grads dropped by zero_grad
  EXPECT_NEAR(static_cast<double>(resident + static_cast<std::size_t>(padded / w) * 4), formula, 0.1 * formula);

  // The step changed every rank's block: the next forward gathers each unit once,
  // and after it the module's own tensors are the full, updated parameters.
  f.forward(b.inputs);
  EXPECT_EQ(f.stats().gathers, static_cast<int>(units));
  const nn::StateDict full = f.full_state_dict();
  for (const auto& [name, p] : run.model->named_parameters())
    EXPECT_EQ(p->data.to_vector<float>(), full.at(name).to_vector<float>()) << name;
  f.forward(b.inputs);  // no step since: nothing to gather
  EXPECT_EQ(f.stats().gathers, 0);
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
  parallel::GradScaler s1(&comm, {.init_scale = 1024, .growth_interval = 4}),
      s2(&comm, {.init_scale = 1024, .growth_interval = 4});
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

// CPU offload: the shards, their gradients and AdamW's moments live in the host pool
// and the step runs there. Same arithmetic as without offload (bit for bit), and the
// copies are really made and counted: per step the shards go to the compute side twice
// (the forward and the backward gathers) and the reduced gradient blocks come back once.
// In both strategies; shard_grad_op keeps its full parameters on the compute device
// and its shards (not views, then) in the pool.
TEST(FullyShardedDataParallel, CpuOffloadKeepsShardsGradientsAndOptimizerStateInTheOffloadMemory) {
  for (const Strategy strategy : {Strategy::full_shard, Strategy::shard_grad_op}) {
    SCOPED_TRACE(strategy == Strategy::full_shard ? "full_shard" : "shard_grad_op");
    FsdpRun plain(world(), Shape::odd, Opt::adamw, kModelSeed, false, strategy);
    FsdpRun offload(world(), Shape::odd, Opt::adamw, kModelSeed, /*cpu_offload=*/true, strategy);
    EXPECT_EQ(plain.fsdp->offload_memory(), nullptr);
    ASSERT_NE(offload.fsdp->offload_memory(), nullptr);
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
    const parallel::OffloadMemory& pool = *offload.fsdp->offload_memory();
    for (const auto& [name, p] : offload.fsdp->optimizer().named_parameters()) {
      EXPECT_TRUE(pool.owns(p->data)) << name;
      EXPECT_TRUE(pool.owns(p->grad)) << name;
    }
    const std::size_t shard = offload.fsdp->shard_parameter_bytes();
    // Parameters + gradients + AdamW's exp_avg and exp_avg_sq: four shard-sized tensors.
    EXPECT_EQ(pool.bytes(), 4 * shard);
    const parallel::FsdpStats& st = offload.fsdp->stats();
    // full_shard gathers each unit for forward and again for backward; shard_grad_op
    // once, after the step.
    EXPECT_EQ(st.offload_bytes_to_device, (strategy == Strategy::full_shard ? 2 : 1) * shard);
    EXPECT_EQ(st.offload_bytes_to_host, shard);
    EXPECT_GT(st.offload_seconds, 0.0);
    if (world().rank() == 0)
      std::printf(
          "cpu offload: pool %zu B (%zu B mapped, %zu B pinned), moved %zu B to device and %zu B back in "
          "%.1f us\n",
          pool.bytes(), pool.mapped_bytes(), pool.pinned_bytes(), st.offload_bytes_to_device, st.offload_bytes_to_host,
          st.offload_seconds * 1e6);
  }
}

// Mixed precision: a bf16 model with f32 master shards against DDP on the bf16 model
// with MasterWeights -- the same roundings (gradients reduced in bf16, combined in
// f32; widened; AdamW and the loss scale's unscale in f32; rounded into the model).
class Bf16MasterShards : public ::testing::TestWithParam<Strategy> {};

TEST_P(Bf16MasterShards, TrainLikeDdpWithMasterWeights) {
  auto& comm = world();
  const auto seed = kModelSeed + static_cast<std::uint64_t>(comm.rank());
  auto ddp_model = testing::make_mlp(seed);
  ddp_model->to(DType::bf16);
  parallel::DistributedDataParallel ddp(*ddp_model, comm);
  parallel::MasterWeights master(*ddp_model);
  nn::AdamW ddp_opt(master.named_parameters(), 1e-2);
  auto fsdp_model = testing::make_mlp(seed);
  fsdp_model->to(DType::bf16);
  parallel::FsdpOptions options = wrapping(Shape::mlp);
  options.master_dtype = DType::f32;
  options.sharding_strategy = GetParam();
  parallel::FullyShardedDataParallel fsdp(*fsdp_model, comm, factory(Opt::adamw), options);
  for (const auto& [name, p] : fsdp.optimizer().named_parameters()) EXPECT_EQ(p->data.dtype(), DType::f32) << name;

  parallel::GradScaler s1(&comm, {.init_scale = 1024}), s2(&comm, {.init_scale = 1024});
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

INSTANTIATE_TEST_SUITE_P(Strategies, Bf16MasterShards, ::testing::Values(Strategy::full_shard, Strategy::shard_grad_op),
                         [](const auto& info) {
                           return std::string(info.param == Strategy::full_shard ? "full_shard" : "shard_grad_op");
                         });

}  // namespace
}  // namespace troupe::train
