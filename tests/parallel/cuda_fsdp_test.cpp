// FSDP on a GPU over NCCL (issue 25): skipped without a CUDA device, and at more than
// one rank (NCCL needs a GPU per rank; the GPU machine has one).
#include <gtest/gtest.h>

#include <string>

#include "fsdp_harness.hpp"
#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/collectives/nccl_communicator.hpp"
#include "troupe/tensor/cuda_memory.hpp"

namespace troupe::train {
namespace {

using namespace fsdp_testing;
using testing::world;
using Strategy = parallel::FsdpOptions::ShardingStrategy;

// Issue 25: FSDP with its model on the GPU and its collectives over NCCL (one rank: NCCL
// needs a GPU per rank), in both strategies, with and without CPU offload from the GPU,
// against the same run on the CPU (CUDA's and OpenBLAS's sums differ in order only).
// The compute stream waits for each gather and reduce-scatter, not the host: forward and
// backward make no host wait on a collective. With offload the shards, their gradients
// and AdamW's state live in the host pool, pinned.
TEST(FullyShardedDataParallel, OnCudaOverNcclTrainsLikeTheCpuRunWithoutHostWaits) {
  auto& comm = world();
  if (!collectives::NcclCommunicator::available()) GTEST_SKIP() << "no CUDA device or no NCCL in this build";
  if (comm.size() != 1) GTEST_SKIP() << "NCCL needs a GPU per rank; run at one rank on a one-GPU machine";
  collectives::MpiCommunicator bootstrap(MPI_COMM_WORLD);
  collectives::NcclCommunicator nccl(bootstrap);
  const tensor::Device gpu = tensor::Device::cuda();
  constexpr int kGpuSteps = 5;
  for (const Strategy strategy : {Strategy::full_shard, Strategy::shard_grad_op})
    for (const bool offload : {false, true}) {
      SCOPED_TRACE(std::string(strategy == Strategy::full_shard ? "full_shard" : "shard_grad_op") +
                   (offload ? ", cpu offload" : ""));
      FsdpRun want(comm, Shape::mlp, Opt::adamw, kModelSeed, false, strategy);
      auto model = make_model(Shape::mlp, kModelSeed);
      model->to(gpu);
      parallel::FsdpOptions options = wrapping(Shape::mlp);
      options.cpu_offload = offload;
      options.sharding_strategy = strategy;
      parallel::FullyShardedDataParallel fsdp(*model, nccl, factory(Opt::adamw), options);
      nn::CrossEntropyLoss loss_fn;
      Batches a(comm), b(comm);
      // Clipped at 0.15, which 4 of these 5 steps' norms pass (0.12-0.28 on the CPU): the
      // shards' sum of squares is taken on the GPU, or on the host with offload.
      constexpr double kClip = 0.15;
      int clipped = 0;
      for (int step = 0; step < kGpuSteps; ++step) {
        want.step(a.next(), {.clip = kClip});
        const TensorBatch batch = b.next();
        const std::uint64_t host_waits = nccl.host_waits();
        loss_fn.forward(fsdp.forward(batch.inputs.to(gpu)), batch.targets);
        fsdp.backward(loss_fn.backward());
        EXPECT_EQ(nccl.host_waits(), host_waits) << "step " << step << ": forward/backward blocked the host on NCCL";
        const double norm = fsdp.clip_grad_norm(kClip);
        EXPECT_NEAR(norm, want.last_norm, 1e-4 * want.last_norm) << "step " << step << ": the clipped norm";
        clipped += want.last_norm > kClip ? 1 : 0;
        fsdp.step();
        fsdp.zero_grad();
      }
      EXPECT_GT(clipped, 0) << "no step was clipped";
      if (offload) {
        for (const auto& [name, p] : fsdp.optimizer().named_parameters())
          EXPECT_TRUE(tensor::is_pinned(p->data)) << name << ": an offloaded shard not in pinned memory";
      }
      std::vector<double> got;
      for (const auto& [name, value] : fsdp.full_state_dict()) {
        const auto v = value.to(tensor::Device::cpu()).to_vector<double>();
        got.insert(got.end(), v.begin(), v.end());
      }
      std::vector<double> reference;
      for (const auto& [name, value] : want.fsdp->full_state_dict()) {
        const auto v = value.to_vector<double>();
        reference.insert(reference.end(), v.begin(), v.end());
      }
      EXPECT_LE(testing::max_relative_difference(got, reference), 1e-4);
    }
}

}  // namespace
}  // namespace troupe::train
