// TF32 for f32 products on CUDA (tensor/cuda_math.hpp): off by default, where f32
// stays f32-accurate; on, gemms, the Linear's bias epilogue and causal attention stay
// within TF32's tolerance of the CPU's f32, and attention's result moves (one TF32
// product where there were three).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gpu_compare.hpp"
#include "troupe/tensor/attention.hpp"
#include "troupe/tensor/cuda_math.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::tensor {
namespace {

// TF32 keeps 10 mantissa bits: each operand is off by up to 2^-11 relative, a sum of
// products by about that over its largest terms.
constexpr double kTf32 = 5e-3;

// max |a - b| over max |b|, a on any device.
double max_relative(const Tensor& a, const Tensor& b) {
  const auto x = a.to(Device::cpu()).to_vector<double>(), y = b.to_vector<double>();
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return scale > 0 ? err / scale : err;
}

// TF32 on for one scope, off again however it ends.
struct AllowTf32 {
  AllowTf32() { set_cuda_allow_tf32(true); }
  ~AllowTf32() { set_cuda_allow_tf32(false); }
};

TEST(CudaTf32, IsOffUntilAllowed) {
  TROUPE_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(cuda_allow_tf32());
  {
    AllowTf32 on;
    EXPECT_TRUE(cuda_allow_tf32());
  }
  EXPECT_FALSE(cuda_allow_tf32());
}

TEST(CudaTf32, MatmulAndLinearStayWithinTf32Tolerance) {
  TROUPE_SKIP_WITHOUT_GPU();
  Generator gen(3);
  const Tensor a = normal({256, 512}, 0, 1, gen), b = normal({512, 384}, 0, 1, gen);
  const Tensor w = normal({384, 512}, 0, 1, gen), bias = normal({384}, 0, 1, gen);
  const Tensor want = matmul(a, b), want_linear = linear(a, w, bias);
  const Device gpu = Device::cuda();
  EXPECT_LT(max_relative(matmul(a.to(gpu), b.to(gpu)), want), 1e-5);
  EXPECT_LT(max_relative(linear(a.to(gpu), w.to(gpu), bias.to(gpu)), want_linear), 1e-5);
  AllowTf32 on;
  EXPECT_LT(max_relative(matmul(a.to(gpu), b.to(gpu)), want), kTf32);
  EXPECT_LT(max_relative(linear(a.to(gpu), w.to(gpu), bias.to(gpu)), want_linear), kTf32);
}

TEST(CudaTf32, AttentionTakesOneTf32ProductWithinItsTolerance) {
  TROUPE_SKIP_WITHOUT_GPU();
  constexpr std::int64_t B = 2, T = 200, H = 2, C = 128;
  Generator gen(5);
  const Tensor qkv = normal({B, T, 3 * C}, 0, 1, gen), gy = normal({B, T, C}, 0, 1, gen);
  const AttentionForward cpu = causal_attention_forward(qkv, H, 0.0, gen);
  const Tensor cpu_grad = causal_attention_backward(gy, qkv, cpu, H);
  const Device gpu = Device::cuda();
  const AttentionForward strict = causal_attention_forward(qkv.to(gpu), H, 0.0, gen);
  const Tensor strict_grad = causal_attention_backward(gy.to(gpu), qkv.to(gpu), strict, H);
  EXPECT_LT(max_relative(strict.out, cpu.out), 1e-5);
  EXPECT_LT(max_relative(strict_grad, cpu_grad), 1e-5);
  AllowTf32 on;
  const AttentionForward fast = causal_attention_forward(qkv.to(gpu), H, 0.0, gen);
  const Tensor fast_grad = causal_attention_backward(gy.to(gpu), qkv.to(gpu), fast, H);
  EXPECT_LT(max_relative(fast.out, cpu.out), kTf32);
  EXPECT_LT(max_relative(fast_grad, cpu_grad), kTf32);
  // One TF32 product rounds what three did not: the result is not the strict one.
  EXPECT_GT(max_relative(fast.out, strict.out.to(Device::cpu())), 1e-6);
}

}  // namespace
}  // namespace troupe::tensor
