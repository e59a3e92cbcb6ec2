// Tensor and pipeline parallelism on GPUs over NCCL (issue 51, item 7) against the same
// layout on the CPU: skipped without a CUDA device and NCCL. At one rank (the GPU
// machine has one device) the layers, the loss, clipping and the schedule run on the
// device over a one-rank NCCL communicator; at two ranks, each with a device of its own,
// tp 2 and pp 2 run with their activations, partial sums and tied table over NCCL. Two
// ranks sharing a GPU run the same over MPI through host copies (staged_communicator.hpp).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gpt_testing.hpp"
#include "train_world.hpp"
#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/collectives/nccl_communicator.hpp"
#include "troupe/collectives/staged_communicator.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/tensor/device.hpp"

// A namespace of its own: the unity build joins this file with the CPU tests'.
namespace troupe::train::testing::cuda_model_parallel {
namespace {

nn::GPTConfig tiny_gpt() { return {.block_size = 16, .vocab_size = 65, .n_layer = 4, .n_head = 2, .n_embd = 16}; }

constexpr int kSteps = 8;
constexpr double kMaxNorm = 0.1;  // below the tiny model's norms: every step clips

struct Run {
  std::vector<double> losses;
  nn::StateDict full;  // the whole model's, gathered
};

std::unique_ptr<nn::AdamW> adamw(nn::Module& m) {
  auto opt = std::make_unique<nn::AdamW>(m.named_parameters(), 3e-3, nn::Betas{0.9, 0.95}, 1e-8, 0.1);
  opt->set_weight_decay_filter(nn::decay_matrices_only);
  return opt;
}

// The GPT split over `tp` on `device`, its vocabulary-parallel loss, clipping over tp.
Run train_tensor_parallel(collectives::Communicator& tp, tensor::Device device) {
  auto model = parallel::tensor_parallel_gpt(tiny_gpt(), 5, tp);
  model->to(device);
  auto opt = adamw(*model);
  parallel::VocabParallelCrossEntropy ce(tp, 65);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    const Tensor x = token_ids(8, 16, 65, 100 + step).to(device), y = token_ids(8, 16, 65, 500 + step).to(device);
    run.losses.push_back(ce.forward(model->forward(x), y).item());
    model->backward(ce.backward());
    parallel::tensor_parallel_clip_grad_norm(*model, kMaxNorm, tp);
    opt->step();
  }
  run.full = parallel::full_state_dict(*model, tp);
  return run;
}

// Stage pp.rank() of the GPT cut into pp.size() on `device`, 1F1B over 4 micro-batches.
Run train_pipeline(collectives::Communicator& pp, tensor::Device device) {
  parallel::GptStage stage(tiny_gpt(), 5, pp.rank(), pp.size());
  stage.to(device);
  parallel::Pipeline pipe(stage, pp, parallel::PipelineSchedule::one_f_one_b, 4);
  auto opt = adamw(stage);
  nn::CrossEntropyLoss ce;
  const parallel::PipelineLoss loss = pipeline_loss(ce);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    opt->zero_grad();
    run.losses.push_back(pipe.forward_backward(token_ids(8, 16, 65, 100 + step).to(device),
                                               token_ids(8, 16, 65, 500 + step).to(device), loss));
    stage.reduce_tied_gradient(pp);
    parallel::pipeline_clip_grad_norm(stage, kMaxNorm, pp);
    opt->step();
    stage.broadcast_tied_table(pp);
  }
  run.full = parallel::pipeline_full_state_dict(stage, pp);
  return run;
}

// cuBLAS's and OpenBLAS's sums differ in order only: losses within 1e-4, every tensor
// within 1e-4 in norm.
void expect_alike(const Run& gpu, const Run& cpu) {
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (std::size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * cpu.losses[i]) << "step " << i;
  ASSERT_EQ(gpu.full.keys(), cpu.full.keys());
  for (const auto& [name, value] : cpu.full)
    EXPECT_LT(norm_relative(gpu.full.at(name).to(tensor::Device::cpu()), value), 1e-4) << name;
}

// Why this test cannot run here ("" when it can).
std::string cannot_run(int ranks) {
  if (!collectives::NcclCommunicator::available()) return "no CUDA device or no NCCL in this build";
  if (world().size() != ranks) return "runs at " + std::to_string(ranks) + " rank(s)";
  if (tensor::cuda_device_count() < ranks)
    return "NCCL needs a GPU per rank: " + std::to_string(ranks) + " rank(s), " +
           std::to_string(tensor::cuda_device_count()) + " device(s)";
  return "";
}

// tp and pp over `comm`'s ranks on `gpu` against the CPU.
void expect_like_the_cpu(collectives::Communicator& comm, tensor::Device gpu) {
  {
    SCOPED_TRACE("tp " + std::to_string(comm.size()) + " over " + std::string(comm.backend()));
    expect_alike(train_tensor_parallel(comm, gpu), train_tensor_parallel(world(), tensor::Device::cpu()));
  }
  {
    SCOPED_TRACE("pp " + std::to_string(comm.size()) + " over " + std::string(comm.backend()));
    expect_alike(train_pipeline(comm, gpu), train_pipeline(world(), tensor::Device::cpu()));
  }
}

// tp and pp over `ranks` ranks, each on a GPU of its own, over NCCL.
void tensor_and_pipeline_parallel_on_cuda_like_the_cpu(int ranks) {
  if (const std::string why = cannot_run(ranks); !why.empty()) GTEST_SKIP() << why;
  collectives::MpiCommunicator bootstrap(MPI_COMM_WORLD);
  collectives::NcclCommunicator nccl(bootstrap);
  expect_like_the_cpu(nccl, tensor::Device::cuda(nccl.device()));
}

TEST(ModelParallel, OnCudaAtOneRankTrainsLikeTheCpu) { tensor_and_pipeline_parallel_on_cuda_like_the_cpu(1); }

TEST(ModelParallel, OnCudaAtTwoRanksTrainsLikeTheCpu) { tensor_and_pipeline_parallel_on_cuda_like_the_cpu(2); }

// Two ranks on whatever GPUs there are (one shared, on the one-GPU machine), as a worker
// with --backend mpi: activations, partial sums and the tied table through host copies.
TEST(ModelParallel, OnCudaOverStagedMpiAtTwoRanksTrainsLikeTheCpu) {
  if (tensor::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (world().size() != 2) GTEST_SKIP() << "runs at 2 rank(s)";
  const tensor::Device gpu = tensor::Device::cuda(world().rank() % tensor::cuda_device_count());
  tensor::cuda_set_device(gpu);
  collectives::StagedCommunicator staged(std::make_unique<collectives::MpiCommunicator>(MPI_COMM_WORLD));
  expect_like_the_cpu(staged, gpu);
}

}  // namespace
}  // namespace troupe::train::testing::cuda_model_parallel
