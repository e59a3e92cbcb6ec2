// The transformer on CUDA against the same on the CPU: the fused attention kernels
// (every head-size class, sequences that end mid-tile, dropout), and a GPT trained a
// few AdamW steps on each device. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../tensor/gpu_compare.hpp"
#include "token_ids.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/tensor/attention.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using nn::testing::token_ids;
using tensor::DType;
using tensor::Generator;

namespace {

const Device cuda_device = Device::cuda();

// max |a - b| / max |b| (the measure), both on the host as f64.
double relative_error(const Tensor& a, const Tensor& b) {
  const auto x = a.to(Device::cpu()).to_vector<double>(), y = b.to(Device::cpu()).to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    diff = std::max(diff, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

double bound_for(DType t) { return t == DType::f64 ? 1e-12 : t == DType::f32 ? 1e-5 : 2e-2; }

}  // namespace

// Head sizes 8, 32 (the 32-wide kernels), 48, 64 (64-wide) and 96, 128 (128-wide);
// sequences of 1, 63, 64, 130, 300 rows (one short tile, exact tiles, tails).
TEST(CudaAttention, ForwardAndBackwardMatchTheCpuForEveryHeadSizeAndLength) {
  TROUPE_SKIP_WITHOUT_GPU();
  struct Case {
    std::int64_t batch, time, heads, head_dim;
  };
  const std::vector<Case> cases = {{2, 1, 2, 8},   {2, 63, 2, 32},  {1, 64, 3, 48}, {2, 130, 2, 64},
                                   {1, 70, 1, 96}, {1, 65, 2, 128}, {1, 300, 2, 64}};
  for (DType t : {DType::f32, DType::f64, DType::bf16}) {
    for (const Case& c : cases) {
      const std::int64_t C = c.heads * c.head_dim;
      Generator data(static_cast<std::uint64_t>(c.time * 31 + c.head_dim));
      const Tensor qkv = tensor::normal({c.batch, c.time, 3 * C}, 0, 1, data, t);
      const Tensor gy = tensor::normal({c.batch, c.time, C}, 0, 1, data, t);
      Generator g_cpu(1), g_gpu(1);
      const auto cpu = tensor::causal_attention_forward(qkv, c.heads, 0.0, g_cpu);
      const auto on_gpu = tensor::causal_attention_forward(qkv.to(cuda_device), c.heads, 0.0, g_gpu);
      const std::string where = "T " + std::to_string(c.time) + ", D " + std::to_string(c.head_dim) + ", " +
                                std::string(tensor::dtype_name(t));
      ASSERT_EQ(on_gpu.out.device(), cuda_device) << where;
      EXPECT_LE(relative_error(on_gpu.out, cpu.out), bound_for(t)) << "forward, " << where;
      EXPECT_LE(relative_error(on_gpu.log_sum_exp, cpu.log_sum_exp), bound_for(t)) << "log-sum-exp, " << where;
      const Tensor d_cpu = tensor::causal_attention_backward(gy, qkv, cpu, c.heads);
      const Tensor d_gpu = tensor::causal_attention_backward(gy.to(cuda_device), qkv.to(cuda_device), on_gpu, c.heads);
      // bf16's gradients sum T products rounded from bf16 inputs on both sides, in another order.
      EXPECT_LE(relative_error(d_gpu, d_cpu), t == DType::bf16 ? 5e-2 : bound_for(t)) << "backward, " << where;
    }
  }
}

TEST(CudaAttention, DropoutDropsTheSameWeightsAsTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t head_dim : {16, 64}) {
      Generator data(3);
      const Tensor qkv = tensor::normal({2, 77, 3 * 2 * head_dim}, 0, 1, data, t);
      const Tensor gy = tensor::normal({2, 77, 2 * head_dim}, 0, 1, data, t);
      Generator g_cpu(9), g_gpu(9);
      const auto cpu = tensor::causal_attention_forward(qkv, 2, 0.3, g_cpu);
      const auto on_gpu = tensor::causal_attention_forward(qkv.to(cuda_device), 2, 0.3, g_gpu);
      const std::string where = "head size " + std::to_string(head_dim) + ", " + std::string(tensor::dtype_name(t));
      EXPECT_EQ(on_gpu.seed, cpu.seed);
      EXPECT_EQ(on_gpu.offset, cpu.offset);
      EXPECT_LE(relative_error(on_gpu.out, cpu.out), bound_for(t)) << where;
      const Tensor d_cpu = tensor::causal_attention_backward(gy, qkv, cpu, 2);
      const Tensor d_gpu = tensor::causal_attention_backward(gy.to(cuda_device), qkv.to(cuda_device), on_gpu, 2);
      EXPECT_LE(relative_error(d_gpu, d_cpu), t == DType::bf16 ? 5e-2 : bound_for(t)) << where;
    }
}

// No atomics: the same inputs give the same bits, which a resumed run relies on.
TEST(CudaAttention, TheBackwardIsDeterministic) {
  TROUPE_SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::bf16}) {
    Generator data(4), g(2);
    const Tensor qkv = tensor::normal({2, 300, 3 * 128}, 0, 1, data, t, cuda_device);
    const Tensor gy = tensor::normal({2, 300, 128}, 0, 1, data, t, cuda_device);
    const auto f = tensor::causal_attention_forward(qkv, 4, 0.0, g);
    const Tensor a = tensor::causal_attention_backward(gy, qkv, f, 4);
    const Tensor b = tensor::causal_attention_backward(gy, qkv, f, 4);
    EXPECT_TRUE(tensor::equal(a, b)) << tensor::dtype_name(t);
  }
}

TEST(CudaAttention, AHeadAbove128IsAClearError) {
  TROUPE_SKIP_WITHOUT_GPU();
  Generator g(1);
  try {
    tensor::causal_attention_forward(Tensor::zeros({1, 4, 3 * 256}, DType::f32, cuda_device), 1, 0.0, g);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("head size 256"), std::string::npos) << e.what();
  }
}

// Ten AdamW steps of a small GPT (two blocks, head size 16, tied head, decay on
// matrices) from the same start on each device: every loss within 1e-4 and every
// parameter within 1e-3 (the measures against PyTorch).
TEST(CudaGpt, TrainsOnTheGpuAsOnTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  const nn::GPTConfig config{.block_size = 24, .vocab_size = 11, .n_layer = 2, .n_head = 2, .n_embd = 32};
  nn::GPT cpu(config, 3), on_gpu(config, 3);
  on_gpu.to(cuda_device);
  nn::AdamW cpu_opt(cpu.named_parameters(), 3e-3, {0.9, 0.95}, 1e-8, 0.1);
  nn::AdamW gpu_opt(on_gpu.named_parameters(), 3e-3, {0.9, 0.95}, 1e-8, 0.1);
  cpu_opt.set_weight_decay_filter(nn::decay_matrices_only);
  gpu_opt.set_weight_decay_filter(nn::decay_matrices_only);
  nn::CrossEntropyLoss cpu_loss, gpu_loss;
  for (int step = 0; step < 10; ++step) {
    const Tensor x = token_ids(4, 24, 11, static_cast<std::uint64_t>(2 * step));
    const Tensor y = token_ids(4, 24, 11, static_cast<std::uint64_t>(2 * step + 1));
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    const double a = cpu_loss.forward(cpu.forward(x), y).item();
    const double b = gpu_loss.forward(on_gpu.forward(x), y).item();
    EXPECT_NEAR(b, a, 1e-4 * std::fabs(a)) << "step " << step;
    cpu.backward(cpu_loss.backward());
    on_gpu.backward(gpu_loss.backward());
    cpu_opt.step();
    gpu_opt.step();
  }
  const auto a = cpu.named_parameters(), b = on_gpu.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].param->data.device(), cuda_device) << b[i].name;
    EXPECT_LE(relative_error(b[i].param->data, a[i].param->data), 1e-3) << a[i].name;
  }
}
