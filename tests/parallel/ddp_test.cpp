// DistributedDataParallel under mpirun: the world's ranks together must train
// exactly like one process with the whole batch.
#include <gtest/gtest.h>

#include "train_world.hpp"
#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/collectives/nccl_communicator.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/train/distributed_sampler.hpp"

namespace troupe::train {
namespace {

using testing::world;

constexpr std::int64_t kGlobalBatch = 64;
constexpr int kSteps = 20;
constexpr std::uint64_t kDataSeed = 7, kModelSeed = 3, kShuffleSeed = 11;

// One process, batch 64 (or `batch`), no DDP: what every world size must reproduce.
std::vector<double> reference_parameters(int steps, std::int64_t global_batch = kGlobalBatch) {
  auto model = testing::make_mlp(kModelSeed);
  const TensorDataset data = testing::make_data(global_batch * steps, kDataSeed);
  nn::SGD sgd(model->named_parameters(), 0.1, 0.9);
  nn::CrossEntropyLoss loss_fn;
  DistributedSampler sampler(data.size(), 1, 0, {.shuffle = true, .seed = kShuffleSeed});
  for (int step = 0; step < steps; ++step) {
    const TensorBatch batch = data.rows(sampler.take(global_batch));
    sgd.zero_grad();
    loss_fn.forward(model->forward(batch.inputs), batch.targets);
    model->backward(loss_fn.backward());
    sgd.step();
  }
  return testing::flat_parameters(*model);
}

TEST(DistributedDataParallel, RanksStartFromRankZerosParametersWhateverTheirSeeds) {
  auto& comm = world();
  auto model = testing::make_mlp(100 + static_cast<std::uint64_t>(comm.rank()));
  parallel::DistributedDataParallel ddp(*model, comm);
  auto rank0_model = testing::make_mlp(100);
  EXPECT_EQ(testing::parameter_hash(*model), testing::parameter_hash(*rank0_model));
  EXPECT_TRUE(testing::same_on_every_rank(testing::parameter_hash(*model)));
}

TEST(DistributedDataParallel, BucketsHoldTheParametersInReverseOrderAndGradsAreViewsIntoThem) {
  auto model = testing::make_mlp(kModelSeed);
  // Layer 2's weight is 32*32*4 = 4 KB: a 5000-byte cap splits the 6 parameters.
  parallel::DistributedDataParallel ddp(*model, world(), {.bucket_bytes = 5000});
  const auto buckets = ddp.bucket_parameter_names();
  ASSERT_GE(buckets.size(), 2u);
  std::vector<std::string> order;
  for (const auto& b : buckets) order.insert(order.end(), b.begin(), b.end());
  EXPECT_EQ(order, (std::vector<std::string>{"4.bias", "4.weight", "2.bias", "2.weight", "0.bias", "0.weight"}));
  auto params = model->named_parameters();
  // Within one bucket, grads share one storage; across buckets they do not.
  EXPECT_TRUE(params[5].param->grad.shares_storage_with(params[4].param->grad));  // 4.bias, 4.weight
  EXPECT_FALSE(params[0].param->grad.shares_storage_with(params[5].param->grad));
}

TEST(DistributedDataParallel, AllRanksTogetherTrainLikeOneRankWithTheWholeBatch) {
  auto& comm = world();
  const std::vector<double> want = reference_parameters(kSteps);

  // world size W: each rank takes 64/W samples of the same global batches.
  ASSERT_EQ(kGlobalBatch % comm.size(), 0);
  const std::int64_t local_batch = kGlobalBatch / comm.size();
  auto model = testing::make_mlp(kModelSeed + static_cast<std::uint64_t>(comm.rank()));  // broadcast fixes it
  parallel::DistributedDataParallel ddp(*model, comm, {.bucket_bytes = 5000});           // several buckets
  const TensorDataset data = testing::make_data(kGlobalBatch * kSteps, kDataSeed);
  nn::SGD sgd(model->named_parameters(), 0.1, 0.9);
  nn::CrossEntropyLoss loss_fn;
  DistributedSampler sampler(data.size(), comm.size(), comm.rank(), {.shuffle = true, .seed = kShuffleSeed});
  for (int step = 0; step < kSteps; ++step) {
    const TensorBatch batch = data.rows(sampler.take(local_batch));
    sgd.zero_grad();
    loss_fn.forward(ddp.forward(batch.inputs), batch.targets);
    ddp.backward(loss_fn.backward());
    EXPECT_EQ(ddp.last_sync_stats().buckets, static_cast<int>(ddp.bucket_parameter_names().size()));
    EXPECT_EQ(ddp.last_sync_stats().buckets_launched_during_backward, ddp.last_sync_stats().buckets)
        << "each bucket should start as soon as its gradients are final, inside backward";
    sgd.step();
    ASSERT_TRUE(testing::same_on_every_rank(testing::parameter_hash(*model))) << "ranks differ after step " << step;
  }
  EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*model), want), 1e-5)
      << comm.size() << " ranks x batch " << local_batch << " vs 1 rank x batch 64";
}

// A global batch the ranks do not divide (63 over 2 or 4 ranks): shares differ by one,
// and each rank's gradient weighted by its share makes the step the one-rank step.
TEST(DistributedDataParallel, UnevenSharesWeightedByShareTrainLikeOneRank) {
  auto& comm = world();
  constexpr std::int64_t kBatch = 63;
  const std::vector<double> want = reference_parameters(kSteps, kBatch);
  const TensorDataset data = testing::make_data(kBatch * kSteps, kDataSeed);
  auto model = testing::make_mlp(kModelSeed);
  parallel::DistributedDataParallel ddp(*model, comm, {.bucket_bytes = 5000});
  nn::SGD sgd(model->named_parameters(), 0.1, 0.9);
  nn::CrossEntropyLoss loss_fn;
  DistributedSampler sampler(data.size(), comm.size(), comm.rank(),
                             {.shuffle = true, .seed = kShuffleSeed, .global_batch = kBatch});
  for (int step = 0; step < kSteps; ++step) {
    const std::int64_t position = sampler.position();
    const TensorBatch batch = data.rows(sampler.take(sampler.local_batch()));
    EXPECT_EQ(batch.size(), kBatch / comm.size() + (comm.rank() < kBatch % comm.size() ? 1 : 0));
    sgd.zero_grad();
    loss_fn.forward(ddp.forward(batch.inputs), batch.targets);
    ddp.backward(loss_fn.backward(sampler.batch_weight(position, batch.size())));
    sgd.step();
  }
  EXPECT_TRUE(testing::same_on_every_rank(testing::parameter_hash(*model)));
  EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*model), want), 1e-5)
      << comm.size() << " ranks with uneven shares of 63 vs 1 rank x batch 63";
}

// Issue 11: the model and its gradient buckets on the GPU, the all-reduce over NCCL on
// its own stream (at one rank: NCCL needs a GPU per rank, and the GPU machine has
// one), against the CPU reference: CUDA's and OpenBLAS's sums differ in order only.
TEST(DistributedDataParallel, OnCudaOverNcclTrainsLikeTheCpuReference) {
  auto& comm = world();
  if (!collectives::NcclCommunicator::available()) GTEST_SKIP() << "no CUDA device or no NCCL in this build";
  if (comm.size() != 1) GTEST_SKIP() << "NCCL needs a GPU per rank; run at one rank on a one-GPU machine";
  const std::vector<double> want = reference_parameters(kSteps);
  collectives::MpiCommunicator bootstrap(MPI_COMM_WORLD);
  collectives::NcclCommunicator nccl(bootstrap);
  const tensor::Device gpu = tensor::Device::cuda();
  auto model = testing::make_mlp(kModelSeed);
  model->to(gpu);
  parallel::DistributedDataParallel ddp(*model, nccl, {.bucket_bytes = 5000});  // several buckets
  const TensorDataset data = testing::make_data(kGlobalBatch * kSteps, kDataSeed);
  nn::SGD sgd(model->named_parameters(), 0.1, 0.9);
  nn::CrossEntropyLoss loss_fn;
  DistributedSampler sampler(data.size(), 1, 0, {.shuffle = true, .seed = kShuffleSeed});
  for (int step = 0; step < kSteps; ++step) {
    const TensorBatch batch = data.rows(sampler.take(kGlobalBatch));
    sgd.zero_grad();
    loss_fn.forward(ddp.forward(batch.inputs.to(gpu)), batch.targets);
    const std::uint64_t host_waits = nccl.host_waits();
    ddp.backward(loss_fn.backward());
    // Issue 25: the default stream waits for each all-reduce, not the host.
    EXPECT_EQ(nccl.host_waits(), host_waits) << "step " << step << ": DDP's backward blocked the host on NCCL";
    EXPECT_GT(ddp.last_sync_stats().buckets, 1);
    EXPECT_EQ(model->named_parameters().front().param->grad.device(), gpu);
    sgd.step();
  }
  model->to(tensor::Device::cpu());
  EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*model), want), 1e-4);
}

TEST(DistributedDataParallel, FourMicroBatchesAccumulatedEqualOneBatchOfTheirSum) {
  auto& comm = world();
  const std::vector<double> want = reference_parameters(kSteps);

  // Each step's 64 samples: 4 micro-batches per rank of 16/W... every rank's share of
  // the global batch (64/W samples) split into 4 micro-batches.
  const std::int64_t local_batch = kGlobalBatch / comm.size();
  ASSERT_EQ(local_batch % 4, 0);
  auto model = testing::make_mlp(kModelSeed);
  parallel::DistributedDataParallel ddp(*model, comm);
  const TensorDataset data = testing::make_data(kGlobalBatch * kSteps, kDataSeed);
  nn::SGD sgd(model->named_parameters(), 0.1, 0.9);
  nn::CrossEntropyLoss loss_fn;
  DistributedSampler sampler(data.size(), comm.size(), comm.rank(), {.shuffle = true, .seed = kShuffleSeed});
  const std::int64_t micro_steps = kSteps * 4;
  for (std::int64_t micro = 0; micro < micro_steps; ++micro) {
    const TensorBatch batch = data.rows(sampler.take(local_batch / 4));
    loss_fn.forward(ddp.forward(batch.inputs), batch.targets);
    const std::uint64_t before = comm.next_sequence();
    const parallel::AccumulationStep r = ddp.optimizer_step_with_gradient_accumulation(
        sgd, [&](double scale) { return loss_fn.backward(scale); }, 4, micro_steps);
    const bool last = micro % 4 == 3;
    EXPECT_EQ(r.stepped, last) << "micro-step " << micro;
    EXPECT_EQ(r.window, 4);
    // Inside a window nothing is sent; the window's end sends one all-reduce per bucket.
    EXPECT_EQ(comm.next_sequence() - before, last ? ddp.bucket_parameter_names().size() : 0u) << "micro-step " << micro;
  }
  EXPECT_EQ(ddp.micro_step(), 0) << "the position wraps at the end of the epoch";
  EXPECT_TRUE(testing::same_on_every_rank(testing::parameter_hash(*model)));
  EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*model), want), 1e-5);
}

TEST(DistributedDataParallel, APartialLastWindowIsScaledByItsOwnSize) {
  // 6 micro-batches with accum_steps 4: windows of 4 and 2. The second step must
  // average over its 2 micro-batches, i.e. equal one batch of those 2 together.
  auto& comm = world();
  const std::int64_t micro = 8;  // samples per rank per micro-batch
  auto reference = testing::make_mlp(kModelSeed);
  auto model = testing::make_mlp(kModelSeed);
  parallel::DistributedDataParallel ddp(*model, comm);
  const TensorDataset data = testing::make_data(6 * micro * comm.size(), kDataSeed);
  nn::SGD sgd_ref(reference->named_parameters(), 0.1), sgd(model->named_parameters(), 0.1);
  nn::CrossEntropyLoss loss_fn;
  // Reference: one process, batches of 4 and 2 micro-batches' worth of every rank.
  DistributedSampler all(data.size(), 1, 0, {.shuffle = false});
  for (std::int64_t window : {4, 2}) {
    const TensorBatch batch = data.rows(all.take(window * micro * comm.size()));
    sgd_ref.zero_grad();
    loss_fn.forward(reference->forward(batch.inputs), batch.targets);
    reference->backward(loss_fn.backward());
    sgd_ref.step();
  }
  // Each rank's micro-batch k must be its share of the reference batch: take rows
  // from the same positions the strided single-rank order would give.
  DistributedSampler mine(data.size(), comm.size(), comm.rank(), {.shuffle = false});
  int steps = 0;
  for (int k = 0; k < 6; ++k) {
    const TensorBatch batch = data.rows(mine.take(micro));
    loss_fn.forward(ddp.forward(batch.inputs), batch.targets);
    const auto r = ddp.optimizer_step_with_gradient_accumulation(
        sgd, [&](double scale) { return loss_fn.backward(scale); }, 4, 6);
    EXPECT_EQ(r.window, k < 4 ? 4 : 2);
    steps += r.stepped ? 1 : 0;
  }
  EXPECT_EQ(steps, 2);
  EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*model), testing::flat_parameters(*reference)),
            1e-5);
}

TEST(DistributedDataParallel, NoSyncSendsNothingAndTheNextBackwardAveragesTheSum) {
  auto& comm = world();
  auto model = testing::make_mlp(kModelSeed);
  parallel::DistributedDataParallel ddp(*model, comm, {.bucket_bytes = 5000});
  const TensorDataset data =
      testing::make_data(3 * 8 * comm.size(), kDataSeed + static_cast<std::uint64_t>(comm.rank()));
  nn::CrossEntropyLoss loss_fn;

  // Local sums of three backwards, computed by a plain copy of the model.
  auto plain = testing::make_mlp(kModelSeed);
  for (int k = 0; k < 3; ++k) {
    const TensorBatch batch =
        data.rows({8 * k, 8 * k + 1, 8 * k + 2, 8 * k + 3, 8 * k + 4, 8 * k + 5, 8 * k + 6, 8 * k + 7});
    loss_fn.forward(plain->forward(batch.inputs), batch.targets);
    plain->backward(loss_fn.backward());
  }

  const std::uint64_t before = comm.next_sequence();
  {
    auto guard = ddp.no_sync();
    EXPECT_FALSE(ddp.sync_enabled());
    for (int k = 0; k < 2; ++k) {
      const TensorBatch batch =
          data.rows({8 * k, 8 * k + 1, 8 * k + 2, 8 * k + 3, 8 * k + 4, 8 * k + 5, 8 * k + 6, 8 * k + 7});
      loss_fn.forward(ddp.forward(batch.inputs), batch.targets);
      ddp.backward(loss_fn.backward());
    }
  }
  EXPECT_TRUE(ddp.sync_enabled());
  EXPECT_EQ(comm.next_sequence(), before) << "no_sync must not issue any collective";
  const TensorBatch batch = data.rows({16, 17, 18, 19, 20, 21, 22, 23});
  loss_fn.forward(ddp.forward(batch.inputs), batch.targets);
  ddp.backward(loss_fn.backward());
  EXPECT_EQ(comm.next_sequence() - before, ddp.bucket_parameter_names().size());

  // The result is the average over ranks of each rank's local sum.
  auto ddp_params = model->named_parameters();
  auto plain_params = plain->named_parameters();
  for (std::size_t i = 0; i < ddp_params.size(); ++i) {
    std::vector<double> local = plain_params[i].param->grad.to_vector<double>();
    std::vector<double> summed(local.size());
    comm.allreduce(collectives::Buffer(local), collectives::Buffer(summed), collectives::ReduceOp::avg);
    EXPECT_LE(testing::max_relative_difference(ddp_params[i].param->grad.to_vector<double>(), summed), 1e-5)
        << ddp_params[i].name;
  }
}

TEST(DistributedDataParallel, GradientsDroppedBySetToNoneAreRestoredAsBucketViews) {
  auto model = testing::make_mlp(kModelSeed);
  parallel::DistributedDataParallel ddp(*model, world());
  nn::CrossEntropyLoss loss_fn;
  const TensorDataset data = testing::make_data(8, kDataSeed);
  model->zero_grad(/*set_to_none=*/true);
  loss_fn.forward(ddp.forward(data.inputs), data.targets);
  ddp.backward(loss_fn.backward());
  auto params = model->named_parameters();
  EXPECT_TRUE(params[0].param->grad.shares_storage_with(params[1].param->grad));
  // And the result is the plain gradient averaged, not doubled by a stale bucket.
  auto plain = testing::make_mlp(kModelSeed);
  loss_fn.forward(plain->forward(data.inputs), data.targets);
  plain->backward(loss_fn.backward());
  // Every rank used the same data, so the average is the local gradient.
  EXPECT_LE(testing::max_relative_difference(testing::flat_parameters(*model), testing::flat_parameters(*plain)), 0);
  std::vector<double> got, want;
  for (auto& [n, p] : model->named_parameters()) {
    auto v = p->grad.to_vector<double>();
    got.insert(got.end(), v.begin(), v.end());
  }
  for (auto& [n, p] : plain->named_parameters()) {
    auto v = p->grad.to_vector<double>();
    want.insert(want.end(), v.begin(), v.end());
  }
  EXPECT_LE(testing::max_relative_difference(got, want), 1e-6);
}

}  // namespace
}  // namespace troupe::train
