// OSS (optimizer state sharding, ZeRO-1) on its own terms: its partition, its
// share of the optimizer state, the global clip norm, loss scaling, state dicts and
// the base optimizer's hyper-parameters.
#include "sharding_harness.hpp"

namespace troupe::train {
namespace {

TEST(OSS, GreedyPartitionBalancesBytesLargestFirst) {
  // Sizes 10, 1, 6, 5, 4 over 2 ranks: 10 -> r0, 6 -> r1, 5 -> r1 (6 < 10), 4 -> r0 (11 > 10)... r0 has 10,
  // r1 has 11 -> 4 goes to r0 (14 vs 11), then 1 -> r1.
  std::vector<nn::Parameter> storage;
  for (std::int64_t n : {10, 1, 6, 5, 4}) storage.push_back({Tensor::zeros({n}), {}});
  std::vector<nn::NamedParameter> params;
  for (std::size_t i = 0; i < storage.size(); ++i) params.push_back({"p" + std::to_string(i), &storage[i]});
  EXPECT_EQ(parallel::partition_parameters(params, 2), (std::vector<int>{0, 1, 1, 1, 0}));
  EXPECT_EQ(parallel::partition_parameters(params, 1), (std::vector<int>{0, 0, 0, 0, 0}));
  // More ranks than parameters: the last rank owns nothing.
  EXPECT_EQ(parallel::partition_parameters(params, 6), (std::vector<int>{0, 4, 1, 2, 3}));
  EXPECT_THROW(parallel::partition_parameters(params, 0), InvalidArgument);
}

TEST(OSS, PartitionsAreDisjointCoverEveryParameterAndAgreeAcrossRanks) {
  auto& comm = world();
  auto model = testing::make_mlp(kModelSeed);
  parallel::OSS oss(model->named_parameters(), comm, factory(Opt::adamw));
  const auto& params = oss.named_parameters();
  std::multiset<std::string> seen;
  std::size_t largest = 0;
  for (int r = 0; r < comm.size(); ++r)
    for (const auto& [name, p] : oss.partition(r)) {
      seen.insert(name);
      EXPECT_EQ(oss.owner(name), r);
      largest = std::max(largest, p->data.nbytes());
    }
  ASSERT_EQ(seen.size(), params.size());                                         // covers, and ...
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

TEST(OSS, BroadcastSyncMatchesAllGatherSyncInOneWindowOrMany) {
  auto& comm = world();
  std::vector<std::vector<double>> finals;
  // The third run all-gathers in windows of 40 bytes: many windows per segment, and
  // parameters cut across windows.
  const std::pair<parallel::OssOptions::Sync, std::size_t> runs[] = {
      {parallel::OssOptions::Sync::all_gather, parallel::OssOptions{}.sync_bucket_bytes},
      {parallel::OssOptions::Sync::broadcast, parallel::OssOptions{}.sync_bucket_bytes},
      {parallel::OssOptions::Sync::all_gather, 40},
      {parallel::OssOptions::Sync::automatic, parallel::OssOptions{}.sync_bucket_bytes}};
  for (auto [sync, window] : runs) {
    auto model = testing::make_mlp(kModelSeed);
    parallel::DistributedDataParallel ddp(*model, comm, {.bucket_bytes = kBucketBytes});
    parallel::OSS oss(model->named_parameters(), comm, factory(Opt::sgd_momentum),
                      {.sync = sync, .sync_bucket_bytes = window});
    EXPECT_EQ(oss.uses_all_gather(), sync == parallel::OssOptions::Sync::all_gather);  // automatic: broadcast
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
  EXPECT_EQ(finals[0], finals[2]);
  EXPECT_EQ(finals[0], finals[3]);
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
  parallel::OSS oss(model.named_parameters(), comm, factory(Opt::adamw));
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
    EXPECT_LE(
        testing::max_relative_difference(testing::flat_parameters(*got.model), testing::flat_parameters(*want.model)),
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
      t.scaler = std::make_unique<parallel::GradScaler>(
          &comm, parallel::GradScalerOptions{.init_scale = 1024, .growth_interval = 4});
      const auto params = t.model->named_parameters();
      const auto owners = parallel::partition_parameters(params, comm.size());
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
  for (const auto& [key, value] : before) wrong.insert(key, key == victim + "/exp_avg" ? Tensor::zeros({3}) : value);
  EXPECT_THROW(t.oss->load_state_dict(wrong), InvalidArgument);

  const nn::StateDict after = t.oss->state_dict();
  ASSERT_EQ(after.keys(), before.keys());
  for (const auto& [key, value] : before) EXPECT_EQ(after.at(key).to_vector<double>(), value.to_vector<double>());
}

TEST(OSS, LrIsTheBaseOptimizers) {
  auto model = testing::make_mlp(kModelSeed);
  parallel::OSS oss(model->named_parameters(), world(), factory(Opt::sgd_momentum));
  EXPECT_DOUBLE_EQ(oss.lr(), 0.1);
  oss.set_lr(0.05);
  EXPECT_DOUBLE_EQ(oss.base().lr(), 0.05);
  EXPECT_DOUBLE_EQ(oss.state_dict().at("lr").item(), 0.05);
  EXPECT_THROW(oss.set_lr(-1), InvalidArgument);
}

}  // namespace
}  // namespace troupe::train
