// nn's optimizers on CUDA parameters (the fused kernels of tensor/fused_optim.hpp)
// against the same optimizers on CPU copies: three steps, f32 relative error < 1e-5.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "troupe/nn/adam.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::nn;

namespace {

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(Parameter&)>;

void expect_cuda_steps_match_cpu(const MakeOptimizer& make, const char* what) {
  tensor::Generator g(3);
  Parameter cpu{tensor::normal({33, 17}, 0, 1, g), Tensor()};
  Parameter gpu{cpu.data.to(Device::cuda()), Tensor()};
  auto on_cpu = make(cpu);
  auto on_gpu = make(gpu);
  for (int step = 0; step < 3; ++step) {
    cpu.grad = tensor::normal({33, 17}, 0, 1, g);
    gpu.grad = cpu.grad.to(Device::cuda());
    on_cpu->step();
    on_gpu->step();
  }
  EXPECT_EQ(gpu.data.device(), Device::cuda()) << what;
  EXPECT_TRUE(tensor::allclose(gpu.data.to(Device::cpu()), cpu.data, 1e-5, 1e-6)) << what;
}

}  // namespace

TEST(CudaOptim, SgdAdamAndAdamWStepCudaParametersLikeCpuOnes) {
  if (!tensor::cuda_available()) GTEST_SKIP() << (tensor::cuda_built() ? "no CUDA device" : "built without CUDA");
  expect_cuda_steps_match_cpu(
      [](Parameter& p) {
        return std::make_unique<SGD>(std::vector<NamedParameter>{{"p", &p}}, 0.1, 0.9, 0.0, 1e-2, true);
      },
      "SGD nesterov");
  expect_cuda_steps_match_cpu(
      [](Parameter& p) {
        return std::make_unique<SGD>(std::vector<NamedParameter>{{"p", &p}}, 0.1);
      },
      "SGD plain");
  expect_cuda_steps_match_cpu(
      [](Parameter& p) {
        return std::make_unique<Adam>(std::vector<NamedParameter>{{"p", &p}}, 1e-2, Betas{0.9, 0.999}, 1e-8, 0.1);
      },
      "Adam");
  expect_cuda_steps_match_cpu(
      [](Parameter& p) {
        return std::make_unique<AdamW>(std::vector<NamedParameter>{{"p", &p}}, 1e-2);
      },
      "AdamW");
}

TEST(CudaOptim, ACudaParameterOtherThanF32IsAClearError) {
  if (!tensor::cuda_available()) GTEST_SKIP() << (tensor::cuda_built() ? "no CUDA device" : "built without CUDA");
  Parameter p{Tensor::zeros({4}, DType::bf16, Device::cuda()), Tensor::zeros({4}, DType::bf16, Device::cuda())};
  SGD opt({{"p", &p}}, 0.1);
  EXPECT_THROW(opt.step(), InvalidArgument);
}
