// ZeRO-1 (DDP + OSS) and ZeRO-2 (ShardedDataParallel + OSS) under mpirun: each must
// train like plain DDP, keep every rank's parameters identical, hold about 1/W of the
// optimizer state, and checkpoint a state that does not depend on the sharding.
#include <string>
#include <unordered_map>

#include "sharding_harness.hpp"
#include "troupe/collectives/mpi_communicator.hpp"

namespace troupe::train {
namespace {

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

TEST(ShardedDataParallel, KeepsOnlyTheOwnedGradientsBetweenSteps) {
  auto& comm = world();
  Trainer t(Mode::zero2, Opt::adamw);
  Batches batches;
  const TensorBatch b = batches.next();
  t.loss_fn.forward(t.sdp->forward(b.inputs), b.targets);
  const std::uint64_t before = comm.next_sequence();
  t.sdp->backward(t.loss_fn.backward());
  const auto names = t.sdp->bucket_parameter_names();
  // One collective per bucket (its reduction for the owner), nothing else.
  if (comm.size() > 1) {
    EXPECT_EQ(comm.next_sequence() - before, names.size());
  }
  std::int64_t full = 0, owned = 0;
  std::unordered_map<std::string, std::int64_t> bytes;
  for (const auto& [name, p] : t.model->named_parameters()) {
    EXPECT_EQ(p->grad.defined(), t.oss->owns(name)) << name;
    bytes[name] = static_cast<std::int64_t>(p->data.nbytes());
    full += bytes[name];
    if (t.oss->owns(name)) owned += bytes[name];
  }
  EXPECT_EQ(t.sdp->last_sync_stats().buckets, static_cast<int>(names.size()));
  // Every reduction started from the grad-ready hook, before backward's compute ended.
  EXPECT_EQ(t.sdp->last_sync_stats().buckets_launched_during_backward, t.sdp->last_sync_stats().buckets);
  EXPECT_GE(names.size(), 2u);
  // Each bucket belongs to one rank, the owner of all its parameters.
  const auto owners = t.sdp->bucket_owners();
  ASSERT_EQ(owners.size(), names.size());
  std::int64_t largest_bucket = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    std::int64_t bucket = 0;
    for (const auto& name : names[k]) {
      EXPECT_EQ(t.oss->owner(name), owners[k]) << name << " in bucket " << k;
      bucket += bytes[name];
    }
    largest_bucket = std::max(largest_bucket, bucket);
  }
  // Between steps: exactly the owned gradients; summed over ranks, the model once.
  const auto held = static_cast<std::int64_t>(t.sdp->gradient_bytes());
  EXPECT_EQ(held, owned);
  EXPECT_EQ(all_sum(held), full);
  if (comm.size() > 1) {
    EXPECT_LT(held, full);
  }
  // During the backward: the owned gradients plus at most two buckets' buffers.
  const auto peak = static_cast<std::int64_t>(t.sdp->peak_gradient_bytes());
  EXPECT_GE(peak, held);
  EXPECT_LE(peak, owned + 2 * largest_bucket);
}

// Both ways of reaching a bucket's owner, an all-reduce and a reduce, train alike: bit
// for bit where the ranks share memory (the collectives' shared-memory reduce is an
// all-reduce only the root copies out), else to 1e-5 (MPI's reduce may sum in another
// order).
TEST(ShardedDataParallel, ReduceAndAllreduceToTheOwnerTrainAlike) {
  using Reduction = parallel::ShardedDdpOptions::Reduction;
  Trainer a(Mode::zero2, Opt::adamw, kModelSeed, Reduction::reduce);
  Trainer b(Mode::zero2, Opt::adamw, kModelSeed, Reduction::allreduce);
  Batches x, y;
  for (int s = 0; s < 5; ++s) {
    a.step(x.next());
    b.step(y.next());
  }
  const auto* mpi = dynamic_cast<const collectives::MpiCommunicator*>(&world());
  const bool same_bits = mpi == nullptr || mpi->shared_memory();  // one rank, or shared memory
  EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*a.model), testing::flat_parameters(*b.model)),
            same_bits ? 0.0 : 1e-5);
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

// One Linear (two parameters): at 4 ranks, ranks 2 and 3 own nothing, build their base
// optimizer over nothing, and still take part in every collective.
TEST(Sharding, RanksThatOwnNothingStillTakePart) {
  auto& comm = world();
  std::vector<std::vector<double>> finals;
  for (Mode mode : {Mode::ddp, Mode::zero1, Mode::zero2}) {
    tensor::Generator gen(21 + static_cast<std::uint64_t>(comm.rank()));
    nn::Sequential model;
    model.emplace<nn::Linear>(16, 4, gen);
    std::unique_ptr<parallel::DistributedDataParallel> ddp;
    std::unique_ptr<parallel::OSS> oss;
    std::unique_ptr<parallel::ShardedDataParallel> sdp;
    std::unique_ptr<nn::Optimizer> plain;
    if (mode == Mode::zero2) {
      oss = std::make_unique<parallel::OSS>(model.named_parameters(), comm, factory(Opt::adamw));
      sdp = std::make_unique<parallel::ShardedDataParallel>(model, *oss, comm);
    } else {
      ddp = std::make_unique<parallel::DistributedDataParallel>(model, comm);
      if (mode == Mode::zero1)
        oss = std::make_unique<parallel::OSS>(model.named_parameters(), comm, factory(Opt::adamw));
      else
        plain = make_optimizer(Opt::adamw, model.named_parameters());
    }
    if (oss && comm.size() > 2 && comm.rank() >= 2) {
      EXPECT_TRUE(oss->partition(comm.rank()).empty());
    }
    Batches batches;
    nn::CrossEntropyLoss loss_fn;
    for (int s = 0; s < 5; ++s) {
      const TensorBatch b = batches.next();
      loss_fn.forward(model.forward(b.inputs), b.targets);
      if (sdp)
        sdp->backward(loss_fn.backward());
      else
        ddp->backward(loss_fn.backward());
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

}  // namespace
}  // namespace troupe::train
