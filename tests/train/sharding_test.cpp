// ZeRO-1 (DDP + OSS) and ZeRO-2 (ShardedDataParallel + OSS) under mpirun: each must
// train like plain DDP, keep every rank's parameters identical, hold about 1/W of the
// optimizer state, and checkpoint a state that does not depend on the sharding.
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
#include "troupe/tensor/random.hpp"
#include "troupe/train/ddp.hpp"
#include "troupe/train/distributed_sampler.hpp"
#include "troupe/train/grad_scaler.hpp"
#include "troupe/train/oss.hpp"
#include "troupe/train/sharded_ddp.hpp"

namespace troupe::train {
namespace {

using testing::world;

constexpr std::int64_t kGlobalBatch = 64;
constexpr int kSteps = 20;
constexpr std::uint64_t kDataSeed = 7, kModelSeed = 3, kShuffleSeed = 11;
constexpr std::size_t kBucketBytes = 5000;  // splits the test MLP into several buckets

enum class Mode { ddp, zero1, zero2 };
enum class Opt { sgd_momentum, adamw };

const char* mode_name(Mode m) { return m == Mode::ddp ? "ddp" : m == Mode::zero1 ? "zero1" : "zero2"; }

std::unique_ptr<nn::Optimizer> make_optimizer(Opt opt, std::vector<nn::NamedParameter> params) {
  if (opt == Opt::sgd_momentum) return std::make_unique<nn::SGD>(std::move(params), 0.1, 0.9);
  return std::make_unique<nn::AdamW>(std::move(params), 1e-2);
}
OptimizerFactory factory(Opt opt) {
  return [opt](std::vector<nn::NamedParameter> params) { return make_optimizer(opt, std::move(params)); };
}

// One data-parallel training setup in any mode: the model (rank-dependent seed, fixed
// by the broadcast from rank 0), its wrapper and its optimizer.
struct Trainer {
  Mode mode;
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<nn::Optimizer> plain;  // ddp
  std::unique_ptr<OSS> oss;              // zero1, zero2
  std::unique_ptr<DistributedDataParallel> ddp;  // ddp, zero1
  std::unique_ptr<ShardedDataParallel> sdp;      // zero2
  nn::CrossEntropyLoss loss_fn;
  double clip = 0;  // max grad norm; 0: no clipping
  double last_norm = -1;
  std::unique_ptr<GradScaler> scaler;
  int poison_step = -1;  // at this step an inf lands in `victim`'s gradient, on its owner only
  std::string victim;
  int steps_done = 0;

  Trainer(Mode m, Opt opt, std::uint64_t model_seed = kModelSeed) : mode(m) {
    auto& comm = world();
    model = testing::make_mlp(model_seed + static_cast<std::uint64_t>(comm.rank()));
    if (mode == Mode::zero2) {
      oss = std::make_unique<OSS>(model->named_parameters(), comm, factory(opt));
      sdp = std::make_unique<ShardedDataParallel>(*model, *oss, comm, ShardedDdpOptions{.bucket_bytes = kBucketBytes});
    } else {
      ddp = std::make_unique<DistributedDataParallel>(*model, comm, DdpOptions{.bucket_bytes = kBucketBytes});
      if (mode == Mode::zero1) oss = std::make_unique<OSS>(model->named_parameters(), comm, factory(opt));
      else plain = make_optimizer(opt, model->named_parameters());
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
      if (oss) oss->step(*scaler);
      else scaler->step(*plain);
      scaler->update();
      if (oss) oss->zero_grad();
      else plain->zero_grad();
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

RunResult train(Mode mode, Opt opt, int steps, int micro = 1) {
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

std::int64_t all_sum(std::int64_t v) {
  if (world().size() > 1) world().allreduce(collectives::Buffer(&v, 1), collectives::ReduceOp::sum);
  return v;
}
std::int64_t all_max(std::int64_t v) {
  if (world().size() > 1) world().allreduce(collectives::Buffer(&v, 1), collectives::ReduceOp::max);
  return v;
}

TEST(OSS, GreedyPartitionBalancesBytesLargestFirst) {
  // Sizes 10, 1, 6, 5, 4 over 2 ranks: 10 -> r0, 6 -> r1, 5 -> r1 (6 < 10), 4 -> r0 (11 > 10)... r0 has 10,
  // r1 has 11 -> 4 goes to r0 (14 vs 11), then 1 -> r1.
  std::vector<nn::Parameter> storage;
  for (std::int64_t n : {10, 1, 6, 5, 4}) storage.push_back({Tensor::zeros({n}), {}});
  std::vector<nn::NamedParameter> params;
  for (std::size_t i = 0; i < storage.size(); ++i) params.push_back({"p" + std::to_string(i), &storage[i]});
  EXPECT_EQ(partition_parameters(params, 2), (std::vector<int>{0, 1, 1, 1, 0}));
  EXPECT_EQ(partition_parameters(params, 1), (std::vector<int>{0, 0, 0, 0, 0}));
  // More ranks than parameters: the last rank owns nothing.
  EXPECT_EQ(partition_parameters(params, 6), (std::vector<int>{0, 4, 1, 2, 3}));
  EXPECT_THROW(partition_parameters(params, 0), InvalidArgument);
}

TEST(OSS, PartitionsAreDisjointCoverEveryParameterAndAgreeAcrossRanks) {
  auto& comm = world();
  auto model = testing::make_mlp(kModelSeed);
  OSS oss(model->named_parameters(), comm, factory(Opt::adamw));
  const auto& params = oss.named_parameters();
  std::multiset<std::string> seen;
  std::size_t largest = 0;
  for (int r = 0; r < comm.size(); ++r)
    for (const auto& [name, p] : oss.partition(r)) {
      seen.insert(name);
      EXPECT_EQ(oss.owner(name), r);
      largest = std::max(largest, p->data.nbytes());
    }
  ASSERT_EQ(seen.size(), params.size());  // covers, and ...
  for (const auto& [name, p] : params) EXPECT_EQ(seen.count(name), 1u) << name;  // ... disjoint
  // The base optimizer was built over this rank's partition exactly.
  const auto mine = oss.partition(comm.rank());
  ASSERT_EQ(oss.base().named_parameters().size(), mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(oss.base().named_parameters()[i].param, mine[i].param);
  // Greedy balance: no rank carries more than the least loaded one plus one parameter.
  const auto bytes = oss.partition_bytes();
  EXPECT_LE(*std::max_element(bytes.begin(), bytes.end()) - *std::min_element(bytes.begin(), bytes.end()), largest);
  std::uint64_t h = 1469598103934665603ull;
  for (int o : oss.owners()) h = (h ^ static_cast<std::uint64_t>(o)) * 1099511628211ull;
  EXPECT_TRUE(testing::same_on_every_rank(h));
  EXPECT_THROW(oss.owner("nope.weight"), InvalidArgument);
}

struct Case {
  Mode mode;
  Opt opt;
  int micro;
};

class ShardingMatchesDdp : public ::testing::TestWithParam<Case> {};

TEST_P(ShardingMatchesDdp, After20StepsWithIdenticalParametersOnEveryRankAfterEachStep) {
  const Case c = GetParam();
  const RunResult want = train(Mode::ddp, c.opt, kSteps, c.micro);
  const RunResult got = train(c.mode, c.opt, kSteps, c.micro);
  EXPECT_EQ(got.steps_identical_on_every_rank, kSteps);
  const double diff = testing::max_relative_difference(got.params, want.params);
  EXPECT_LE(diff, 1e-5) << mode_name(c.mode);
  if (world().rank() == 0) std::printf("%s vs ddp: max relative difference %.3g\n", mode_name(c.mode), diff);
  // The parameters moved: a run that never stepped would match nothing.
  const RunResult start = train(Mode::ddp, c.opt, 0);
  EXPECT_GT(testing::max_relative_difference(got.params, start.params), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardingMatchesDdp,
                         ::testing::Values(Case{Mode::zero1, Opt::sgd_momentum, 1}, Case{Mode::zero1, Opt::adamw, 1},
                                           Case{Mode::zero2, Opt::sgd_momentum, 1}, Case{Mode::zero2, Opt::adamw, 1},
                                           Case{Mode::zero2, Opt::adamw, 2}, Case{Mode::zero1, Opt::sgd_momentum, 2}),
                         [](const auto& info) {
                           return std::string(mode_name(info.param.mode)) +
                                  (info.param.opt == Opt::adamw ? "_adamw" : "_sgd_momentum") +
                                  (info.param.micro > 1 ? "_accumulate" : "");
                         });

TEST(OSS, BroadcastSyncMatchesAllGatherSync) {
  auto& comm = world();
  std::vector<std::vector<double>> finals;
  for (auto sync : {OssOptions::Sync::all_gather, OssOptions::Sync::broadcast}) {
    auto model = testing::make_mlp(kModelSeed);
    DistributedDataParallel ddp(*model, comm, {.bucket_bytes = kBucketBytes});
    OSS oss(model->named_parameters(), comm, factory(Opt::sgd_momentum), {.sync = sync});
    EXPECT_EQ(oss.uses_all_gather(), sync == OssOptions::Sync::all_gather);
    Batches batches;
    nn::CrossEntropyLoss loss_fn;
    for (int s = 0; s < 5; ++s) {
      const TensorBatch b = batches.next();
      loss_fn.forward(ddp.forward(b.inputs), b.targets);
      ddp.backward(loss_fn.backward());
      oss.step();
      oss.zero_grad();
      EXPECT_TRUE(testing::same_on_every_rank(testing::parameter_hash(*model)));
    }
    finals.push_back(testing::flat_parameters(*model));
  }
  EXPECT_EQ(finals[0], finals[1]);
}

TEST(ShardedDataParallel, KeepsOnlyTheOwnedGradientsBetweenSteps) {
  auto& comm = world();
  Trainer t(Mode::zero2, Opt::adamw);
  Batches batches;
  const TensorBatch b = batches.next();
  t.loss_fn.forward(t.sdp->forward(b.inputs), b.targets);
  t.sdp->backward(t.loss_fn.backward());
  std::int64_t full = 0;
  for (const auto& [name, p] : t.model->named_parameters()) {
    EXPECT_EQ(p->grad.defined(), t.oss->owns(name)) << name;
    full += static_cast<std::int64_t>(p->data.nbytes());
  }
  EXPECT_EQ(t.sdp->last_sync_stats().buckets, static_cast<int>(t.sdp->bucket_parameter_names().size()));
  // Every reduce-scatter started from the grad-ready hook, before backward's compute ended.
  EXPECT_EQ(t.sdp->last_sync_stats().buckets_launched_during_backward, t.sdp->last_sync_stats().buckets);
  EXPECT_GE(t.sdp->bucket_parameter_names().size(), 2u);
  // Between steps: the owned shard only; summed over ranks, the model once plus padding.
  const auto held = static_cast<std::int64_t>(t.sdp->gradient_bytes());
  EXPECT_EQ(all_sum(held), full + t.sdp->padding_elements() * 4);
  if (comm.size() > 1) {
    EXPECT_LT(held, full);
  }
}

// Two synchronising backwards with no zero_grad between: DDP's gradients are the sum
// of the two averages, and so are zero2's owned ones (the shard is added to, not
// overwritten); also through a no_sync window that follows.
TEST(ShardedDataParallel, OwnedGradientsAccumulateAcrossSynchronisingBackwardsLikeDdp) {
  Trainer ddp(Mode::ddp, Opt::sgd_momentum), zero2(Mode::zero2, Opt::sgd_momentum);
  Batches a, b;
  for (int k = 0; k < 3; ++k) {
    const TensorBatch x = a.next(), y = b.next();
    ddp.loss_fn.forward(ddp.ddp->forward(x.inputs), x.targets);
    zero2.loss_fn.forward(zero2.sdp->forward(y.inputs), y.targets);
    if (k == 1) {  // a local micro-batch in the middle
      auto g1 = ddp.ddp->no_sync();
      auto g2 = zero2.sdp->no_sync();
      ddp.ddp->backward(ddp.loss_fn.backward());
      zero2.sdp->backward(zero2.loss_fn.backward());
    } else {
      ddp.ddp->backward(ddp.loss_fn.backward());
      zero2.sdp->backward(zero2.loss_fn.backward());
    }
  }
  const auto want = ddp.model->named_parameters();
  const auto got = zero2.model->named_parameters();
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!zero2.oss->owns(got[i].name)) {
      EXPECT_FALSE(got[i].param->grad.defined()) << got[i].name;
      continue;
    }
    ASSERT_TRUE(got[i].param->grad.defined()) << got[i].name;
    EXPECT_LE(testing::max_relative_difference(got[i].param->grad.to_vector<double>(),
                                               want[i].param->grad.to_vector<double>()),
              1e-5)
        << got[i].name;
  }
}

// Optimizer state per rank is the base optimizer's state over the partition: summed
// over ranks, exactly the unsharded optimizer's; the largest rank within 10% of 1/W
// on a model of equal layers.
TEST(OSS, EachRankHoldsAboutOneWthOfTheOptimizerState) {
  auto& comm = world();
  tensor::Generator gen(5);
  nn::Sequential model;
  for (int i = 0; i < 8; ++i) model.emplace<nn::Linear>(64, 64, gen);
  nn::AdamW full(model.named_parameters(), 1e-3);
  OSS oss(model.named_parameters(), comm, factory(Opt::adamw));
  for (const auto& [name, p] : model.named_parameters()) p->grad = Tensor::ones(p->data.shape());
  full.step();
  oss.step();
  std::int64_t full_bytes = 0;
  for (const auto& [key, value] : full.state_dict())
    if (key.find('/') != std::string::npos) full_bytes += static_cast<std::int64_t>(value.nbytes());
  const auto mine = static_cast<std::int64_t>(oss.local_state_bytes());
  EXPECT_GT(mine, 0);
  EXPECT_EQ(all_sum(mine), full_bytes);
  const std::int64_t largest = all_max(mine);
  EXPECT_LE(static_cast<double>(largest), 1.1 * static_cast<double>(full_bytes) / comm.size());
  if (comm.rank() == 0)
    std::printf("optimizer state: unsharded %lld B, largest rank %lld B at %d ranks\n",
                static_cast<long long>(full_bytes), static_cast<long long>(largest), comm.size());
}

// The global norm gathered from the owners' parts is DDP's norm over the full
// gradients, and clipping with it trains the same.
TEST(OSS, ClipGradNormIsTheGlobalNorm) {
  for (Mode mode : {Mode::zero1, Mode::zero2}) {
    Trainer want(Mode::ddp, Opt::sgd_momentum), got(mode, Opt::sgd_momentum);
    want.clip = got.clip = 0.2;
    Batches a, b;
    int clipped = 0;
    for (int s = 0; s < 10; ++s) {
      want.step(a.next());
      got.step(b.next());
      EXPECT_NEAR(got.last_norm, want.last_norm, 1e-5 * want.last_norm) << mode_name(mode) << " step " << s;
      clipped += want.last_norm > want.clip ? 1 : 0;
    }
    EXPECT_GT(clipped, 0);  // the clip mattered
    EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*got.model),
                                               testing::flat_parameters(*want.model)),
              1e-5)
        << mode_name(mode);
  }
}

// A loss scale with an overflow in one rank's shard only: the all-reduced verdict makes
// every rank skip that step, exactly as DDP (whose averaged gradient is inf everywhere).
TEST(OSS, GradScalerSkipsTheStepOnEveryRankWhenAnyShardOverflows) {
  auto& comm = world();
  for (Mode mode : {Mode::zero1, Mode::zero2}) {
    std::vector<std::vector<double>> finals;
    for (Mode m : {Mode::ddp, mode}) {
      Trainer t(m, Opt::adamw);
      t.scaler = std::make_unique<GradScaler>(&comm, GradScalerOptions{.init_scale = 1024, .growth_interval = 4});
      const auto params = t.model->named_parameters();
      const auto owners = partition_parameters(params, comm.size());
      for (std::size_t i = 0; i < params.size(); ++i)
        if (owners[i] == comm.size() - 1) t.victim = params[i].name;
      t.poison_step = 3;
      Batches batches;
      for (int s = 0; s < 10; ++s) {
        t.step(batches.next());
        EXPECT_TRUE(testing::same_on_every_rank(testing::parameter_hash(*t.model))) << mode_name(m) << " step " << s;
      }
      EXPECT_EQ(t.scaler->skipped_steps(), 1) << mode_name(m);
      EXPECT_EQ(t.oss ? t.oss->step_count() : t.plain->step_count(), 9) << mode_name(m);
      finals.push_back(testing::flat_parameters(*t.model));
    }
    EXPECT_LE(testing::max_relative_difference(finals[1], finals[0]), 1e-5) << mode_name(mode);
  }
}

// One Linear (two parameters): at 4 ranks, ranks 2 and 3 own nothing, build their base
// optimizer over nothing, and still take part in every collective.
TEST(Sharding, RanksThatOwnNothingStillTakePart) {
  auto& comm = world();
  std::vector<std::vector<double>> finals;
  for (Mode mode : {Mode::ddp, Mode::zero1, Mode::zero2}) {
    tensor::Generator gen(21 + static_cast<std::uint64_t>(comm.rank()));
    nn::Sequential model;
    model.emplace<nn::Linear>(16, 4, gen);
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<OSS> oss;
    std::unique_ptr<ShardedDataParallel> sdp;
    std::unique_ptr<nn::Optimizer> plain;
    if (mode == Mode::zero2) {
      oss = std::make_unique<OSS>(model.named_parameters(), comm, factory(Opt::adamw));
      sdp = std::make_unique<ShardedDataParallel>(model, *oss, comm);
    } else {
      ddp = std::make_unique<DistributedDataParallel>(model, comm);
      if (mode == Mode::zero1) oss = std::make_unique<OSS>(model.named_parameters(), comm, factory(Opt::adamw));
      else plain = make_optimizer(Opt::adamw, model.named_parameters());
    }
    if (oss && comm.size() > 2 && comm.rank() >= 2) {
      EXPECT_TRUE(oss->partition(comm.rank()).empty());
    }
    Batches batches;
    nn::CrossEntropyLoss loss_fn;
    for (int s = 0; s < 5; ++s) {
      const TensorBatch b = batches.next();
      loss_fn.forward(model.forward(b.inputs), b.targets);
      if (sdp) sdp->backward(loss_fn.backward());
      else ddp->backward(loss_fn.backward());
      if (oss) {
        oss->step();
        oss->zero_grad();
      } else {
        plain->step();
        plain->zero_grad();
      }
      EXPECT_TRUE(testing::same_on_every_rank(testing::parameter_hash(model))) << mode_name(mode);
    }
    if (oss) {
      const nn::StateDict full = oss->state_dict();
      EXPECT_TRUE(full.contains("0.weight/exp_avg") && full.contains("0.bias/exp_avg_sq")) << mode_name(mode);
      EXPECT_NO_THROW(oss->load_state_dict(full)) << mode_name(mode);
    }
    finals.push_back(testing::flat_parameters(model));
  }
  EXPECT_LE(testing::max_relative_difference(finals[1], finals[0]), 1e-5);
  EXPECT_LE(testing::max_relative_difference(finals[2], finals[0]), 1e-5);
}

class ShardedStateDict : public ::testing::TestWithParam<Mode> {};

// Save after 5 steps, train 5 more; a fresh setup (other seed) restored from the save
// must take the same 5 steps bit for bit.
TEST_P(ShardedStateDict, RoundTripContinuesBitIdentically) {
  const Mode mode = GetParam();
  Trainer first(mode, Opt::adamw);
  Batches batches;
  for (int s = 0; s < 5; ++s) first.step(batches.next());
  const nn::StateDict saved = first.oss->state_dict();
  std::vector<Tensor> saved_params;
  for (const auto& [name, p] : first.model->named_parameters()) saved_params.push_back(p->data.clone());
  for (int s = 5; s < 10; ++s) first.step(batches.next());

  Trainer second(mode, Opt::adamw, /*model_seed=*/99);
  const auto params = second.model->named_parameters();
  for (std::size_t i = 0; i < params.size(); ++i) params[i].param->data.copy_(saved_params[i]);
  second.oss->load_state_dict(saved);
  EXPECT_EQ(second.oss->step_count(), 5);
  Batches resumed(5);
  for (int s = 5; s < 10; ++s) second.step(resumed.next());
  EXPECT_EQ(testing::parameter_hash(*second.model), testing::parameter_hash(*first.model));
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardedStateDict, ::testing::Values(Mode::zero1, Mode::zero2),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

// The consolidated state is what the unsharded optimizer would hold: same keys in the
// same order, same values, and it loads into one.
TEST(OSS, ConsolidatedStateDictEqualsTheUnshardedOptimizers) {
  Trainer ddp(Mode::ddp, Opt::adamw), zero1(Mode::zero1, Opt::adamw);
  Batches a, b;
  for (int s = 0; s < 3; ++s) {
    ddp.step(a.next());
    zero1.step(b.next());
  }
  const nn::StateDict want = ddp.plain->state_dict();
  const nn::StateDict got = zero1.oss->state_dict();
  ASSERT_EQ(got.keys(), want.keys());
  for (const auto& [key, value] : want) {
    const Tensor& other = got.at(key);
    ASSERT_EQ(other.shape(), value.shape()) << key;
    ASSERT_EQ(other.dtype(), value.dtype()) << key;
    EXPECT_EQ(other.to_vector<double>(), value.to_vector<double>()) << key;  // zero1 is DDP's exact arithmetic
  }
  auto model = testing::make_mlp(kModelSeed);
  nn::AdamW unsharded(model->named_parameters());
  EXPECT_NO_THROW(unsharded.load_state_dict(got));
  EXPECT_EQ(unsharded.step_count(), 3);
}

TEST(OSS, LoadStateDictRejectsBadInputOnEveryRankAndKeepsTheOldState) {
  auto& comm = world();
  Trainer t(Mode::zero1, Opt::adamw);
  Batches batches;
  t.step(batches.next());
  const nn::StateDict before = t.oss->state_dict();

  nn::StateDict unknown;
  for (const auto& [key, value] : before) unknown.insert(key, value);
  unknown.insert("9.weight/exp_avg", Tensor::zeros({2, 2}));
  try {
    t.oss->load_state_dict(unknown);
    ADD_FAILURE() << "an unknown parameter was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("9.weight/exp_avg"), std::string::npos) << e.what();
  }

  // A wrong shape for a parameter only the last rank owns: every rank must throw.
  std::string victim;
  for (const auto& [name, p] : t.model->named_parameters())
    if (t.oss->owner(name) == comm.size() - 1) victim = name;
  ASSERT_FALSE(victim.empty());
  nn::StateDict wrong;
  for (const auto& [key, value] : before)
    wrong.insert(key, key == victim + "/exp_avg" ? Tensor::zeros({3}) : value);
  EXPECT_THROW(t.oss->load_state_dict(wrong), InvalidArgument);

  const nn::StateDict after = t.oss->state_dict();
  ASSERT_EQ(after.keys(), before.keys());
  for (const auto& [key, value] : before) EXPECT_EQ(after.at(key).to_vector<double>(), value.to_vector<double>());
}

TEST(OSS, LrIsTheBaseOptimizers) {
  auto model = testing::make_mlp(kModelSeed);
  OSS oss(model->named_parameters(), world(), factory(Opt::sgd_momentum));
  EXPECT_DOUBLE_EQ(oss.lr(), 0.1);
  oss.set_lr(0.05);
  EXPECT_DOUBLE_EQ(oss.base().lr(), 0.05);
  EXPECT_DOUBLE_EQ(oss.state_dict().at("lr").item(), 0.05);
  EXPECT_THROW(oss.set_lr(-1), InvalidArgument);
}

}  // namespace
}  // namespace troupe::train
