#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../tensor/gpu_compare.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::nn;

TEST(ClipGradNorm, ReturnsTheTotalNormAndScalesGradsDownToMaxNorm) {
  Parameter a{Tensor::zeros({2}), Tensor::from_vector<float>({3, 0})};
  Parameter b{Tensor::zeros({1}), Tensor::from_vector<float>({4})};
  Parameter none{Tensor::zeros({1}), Tensor()};
  const double total = clip_grad_norm(std::vector<NamedParameter>{{"a", &a}, {"b", &b}, {"n", &none}}, 1.0);
  EXPECT_DOUBLE_EQ(total, 5.0);
  const double factor = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(a.grad.to_vector<double>()[0], 3 * factor, 1e-7);
  EXPECT_NEAR(b.grad.to_vector<double>()[0], 4 * factor, 1e-7);
  EXPECT_FALSE(none.grad.defined());
}

TEST(ClipGradNorm, LeavesGradsAloneBelowMaxNorm) {
  Parameter a{Tensor::zeros({2}), Tensor::from_vector<double>({0.3, 0.4})};
  EXPECT_DOUBLE_EQ(clip_grad_norm(std::vector<Parameter*>{&a}, 1.0), 0.5);
  EXPECT_EQ(a.grad.to_vector<double>(), (std::vector<double>{0.3, 0.4}));
  EXPECT_THROW(clip_grad_norm(std::vector<Parameter*>{&a}, -1.0), InvalidArgument);
}

TEST(ClipGradNorm, ReturnsANonFiniteNormWithoutTouchingTheGrads) {
  Parameter a{Tensor::zeros({2}), Tensor::from_vector<double>({INFINITY, 1})};
  EXPECT_TRUE(std::isinf(clip_grad_norm(std::vector<Parameter*>{&a}, 1.0)));
  EXPECT_EQ(a.grad.to_vector<double>()[1], 1.0);
}

// On a GPU the norms are summed on the device, one read-back for all of them: the same
// total and the same scaling as the CPU, with a CPU gradient in the list too.
TEST(CudaClipGradNorm, GpuGradientsClipAsOnTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  tensor::Generator gen(5);
  std::vector<Tensor> grads;
  for (std::int64_t n : {7, 1000, 3, 4096}) grads.push_back(tensor::normal({n}, 0, 1, gen));
  std::vector<Parameter> on_cpu, on_gpu;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    on_cpu.push_back(Parameter{Tensor::zeros({1}), grads[i].clone()});
    // The first stays on the host: a list may mix devices (CPU offload).
    on_gpu.push_back(Parameter{Tensor::zeros({1}), i == 0 ? grads[i].clone() : grads[i].to(Device::cuda())});
  }
  std::vector<Parameter*> cpu_list, gpu_list;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    cpu_list.push_back(&on_cpu[i]);
    gpu_list.push_back(&on_gpu[i]);
  }
  const double want = clip_grad_norm(cpu_list, 1.0), got = clip_grad_norm(gpu_list, 1.0);
  EXPECT_NEAR(got, want, 1e-6 * want);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const auto a = on_gpu[i].grad.to(Device::cpu()).to_vector<double>(), b = on_cpu[i].grad.to_vector<double>();
    for (std::size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(a[j], b[j], 1e-6) << "gradient " << i << ", element " << j;
  }
  Parameter bad{Tensor::zeros({1}), Tensor::from_vector<float>({NAN, 1}).to(Device::cuda())};
  EXPECT_TRUE(std::isnan(clip_grad_norm(std::vector<Parameter*>{&bad}, 1.0)));
}
