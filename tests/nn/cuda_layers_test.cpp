// nn's layers, losses and a whole training loop on CUDA against the same on the CPU
// (issue 11: f32 relative error < 1e-5, bf16 < 1e-2; tests/tensor/gpu_compare.hpp's
// tolerance). Skipped without a GPU.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "../tensor/gpu_compare.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adam.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/layer_norm.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::nn;
using tensor::testing::matches_cpu;

namespace {

const Device gpu = Device::cuda();

Tensor labels(std::int64_t rows, std::int64_t classes, std::uint64_t seed) {
  Tensor y = Tensor::empty({rows}, DType::i64);
  for (std::int64_t r = 0; r < rows; ++r)
    y.data<std::int64_t>()[r] = static_cast<std::int64_t>((r * 7 + seed) % classes);
  return y;
}

}  // namespace

TEST(CudaLayers, ActivationsForwardAndBackwardMatchTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  const std::vector<std::function<std::unique_ptr<Module>()>> makers = {
      [] { return std::make_unique<ReLU>(); }, [] { return std::make_unique<GELU>(); },
      [] { return std::make_unique<GELU>("tanh"); }, [] { return std::make_unique<Tanh>(); }};
  for (DType t : {DType::f32, DType::bf16}) {
    tensor::Generator g(11);
    const Tensor x = tensor::normal({64, 33}, 0, 2, g, t), gy = tensor::normal({64, 33}, 0, 1, g, t);
    for (const auto& make : makers) {
      auto cpu = make(), on_gpu = make();
      const Tensor y = cpu->forward(x), y_gpu = on_gpu->forward(x.to(gpu));
      EXPECT_EQ(y_gpu.device(), gpu);
      EXPECT_TRUE(matches_cpu(y_gpu, y)) << cpu->type_name() << " forward, " << t;
      EXPECT_TRUE(matches_cpu(on_gpu->backward(gy.to(gpu)), cpu->backward(gy)))
          << cpu->type_name() << " backward, " << t;
    }
  }
}

TEST(CudaLayers, LinearForwardAndBackwardMatchTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::bf16}) {
    tensor::Generator a(5), b(5), data(6);
    Linear cpu(48, 20, a, true, t), on_gpu(48, 20, b, true, t);
    on_gpu.to(gpu);
    EXPECT_EQ(on_gpu.weight().data.device(), gpu);
    const Tensor x = tensor::normal({16, 48}, 0, 1, data, t), gy = tensor::normal({16, 20}, 0, 1, data, t);
    EXPECT_TRUE(matches_cpu(on_gpu.forward(x.to(gpu)), cpu.forward(x))) << t;
    EXPECT_TRUE(matches_cpu(on_gpu.backward(gy.to(gpu)), cpu.backward(gy))) << t;
    EXPECT_TRUE(matches_cpu(on_gpu.weight().grad, cpu.weight().grad)) << t;
    EXPECT_TRUE(matches_cpu(on_gpu.bias()->grad, cpu.bias()->grad)) << t;
  }
}

TEST(CudaLayers, LayerNormForwardAndBackwardMatchTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  // 21 rows: not a whole number of the kernels' 8 rows per block. 768: GPT-2's width.
  for (DType t : {DType::f32, DType::bf16}) {
    for (std::int64_t width : {40, 768}) {
      LayerNorm cpu(width, 1e-5, true, t), on_gpu(width, 1e-5, true, t);
      tensor::Generator g(2);
      // A non-trivial affine part, the same on both.
      cpu.named_parameters()[0].param->data = tensor::normal({width}, 1, 0.5, g, t);
      cpu.named_parameters()[1].param->data = tensor::normal({width}, 0, 0.5, g, t);
      on_gpu.named_parameters()[0].param->data = cpu.named_parameters()[0].param->data.to(gpu);
      on_gpu.named_parameters()[1].param->data = cpu.named_parameters()[1].param->data.to(gpu);
      const Tensor x = tensor::normal({3, 7, width}, 2, 3, g, t), gy = tensor::normal({3, 7, width}, 0, 1, g, t);
      EXPECT_TRUE(matches_cpu(on_gpu.forward(x.to(gpu)), cpu.forward(x))) << t << " width " << width;
      EXPECT_TRUE(matches_cpu(on_gpu.backward(gy.to(gpu)), cpu.backward(gy))) << t << " width " << width;
      for (std::size_t i = 0; i < 2; ++i)
        EXPECT_TRUE(matches_cpu(on_gpu.named_parameters()[i].param->grad, cpu.named_parameters()[i].param->grad))
            << cpu.named_parameters()[i].name << " " << t << " width " << width;
    }
  }
}

TEST(CudaLayers, DropoutDropsTheSameElementsAsOnTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  Dropout cpu(0.3, 17), on_gpu(0.3, 17);
  tensor::Generator g(4);
  const Tensor x = tensor::normal({50, 20}, 0, 1, g), gy = tensor::normal({50, 20}, 0, 1, g);
  for (int call = 0; call < 2; ++call) {  // the generators advance alike
    EXPECT_TRUE(tensor::equal(on_gpu.forward(x.to(gpu)).to(Device::cpu()), cpu.forward(x))) << "call " << call;
    EXPECT_TRUE(tensor::equal(on_gpu.backward(gy.to(gpu)).to(Device::cpu()), cpu.backward(gy))) << "call " << call;
  }
}

// Repeated indices sum into one row in index order on both devices, so even bf16
// gradients are bit-identical; GPU indices work as CPU ones do.
TEST(CudaLayers, EmbeddingLooksUpAndScatterAddsLikeTheCpuBitForBit) {
  TROUPE_SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::bf16}) {
    tensor::Generator a(1), b(1), g(2);
    Embedding cpu(10, 6, a, t), on_gpu(10, 6, b, t);
    on_gpu.to(gpu);
    const Tensor indices = Tensor::from_vector<std::int64_t>({3, 1, 3, 9, 3, 0, 1, 7}, {2, 4});
    const Tensor gy = tensor::normal({2, 4, 6}, 0, 1, g, t);
    for (int pass = 0; pass < 2; ++pass) {  // the second pass accumulates into the grads
      const Tensor looked_up = on_gpu.forward(pass ? indices.to(gpu) : indices);
      EXPECT_TRUE(tensor::equal(looked_up.to(Device::cpu()), cpu.forward(indices))) << t;
      on_gpu.backward(gy.to(gpu));
      cpu.backward(gy);
      EXPECT_TRUE(tensor::equal(on_gpu.weight().grad.to(Device::cpu()), cpu.weight().grad)) << t << " pass " << pass;
    }
  }
}

TEST(CudaLosses, CrossEntropyMatchesTheCpuWithSmoothingIgnoredRowsAndEitherTargetDevice) {
  TROUPE_SKIP_WITHOUT_GPU();
  for (DType t : {DType::f32, DType::f64, DType::bf16}) {
    for (std::int64_t classes : {10, 1000, 1001}) {  // 1001: rows start at every alignment
      tensor::Generator g(3);
      const Tensor logits = tensor::normal({37, classes}, 0, 3, g, t);
      Tensor y = labels(37, classes, 2);
      y.data<std::int64_t>()[5] = -100;  // ignored
      for (bool target_on_gpu : {false, true}) {
        CrossEntropyLoss cpu(-100, 0.1), on_gpu(-100, 0.1);
        const Tensor loss = on_gpu.forward(logits.to(gpu), target_on_gpu ? y.to(gpu) : y);
        EXPECT_EQ(loss.device(), gpu);
        EXPECT_TRUE(matches_cpu(loss, cpu.forward(logits, y))) << t << " C=" << classes;
        EXPECT_TRUE(matches_cpu(on_gpu.backward(0.5), cpu.backward(0.5))) << t << " C=" << classes;
      }
    }
  }
}

TEST(CudaLosses, AnOutOfRangeCudaTargetIsAClearErrorNamingItsRow) {
  TROUPE_SKIP_WITHOUT_GPU();
  Tensor y = labels(8, 10, 0);
  y.data<std::int64_t>()[6] = 10;
  CrossEntropyLoss loss;
  try {
    loss.forward(Tensor::zeros({8, 10}, DType::f32, gpu), y.to(gpu));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("target 10 at row 6 is out of range for 10 classes"), std::string::npos)
        << e.what();
  }
}

TEST(CudaLosses, MseMatchesTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  tensor::Generator g(9);
  const Tensor x = tensor::normal({19, 7}, 0, 1, g), target = tensor::normal({19, 7}, 0, 1, g);
  MSELoss cpu, on_gpu;
  EXPECT_TRUE(matches_cpu(on_gpu.forward(x.to(gpu), target.to(gpu)), cpu.forward(x, target)));
  EXPECT_TRUE(matches_cpu(on_gpu.backward(2.0), cpu.backward(2.0)));
}

// Ten Adam steps of an MLP with cross-entropy, on each device from the same start:
// every step's loss and the final weights agree (f32; the errors of ten steps add up,
// so the bar is 1e-4).
TEST(CudaTraining, AnMlpTrainsOnTheGpuAsOnTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  const auto make = [] {
    tensor::Generator g(21);
    auto model = std::make_shared<Sequential>();
    model->emplace<Linear>(64, 48, g);
    model->emplace<GELU>();
    model->emplace<Linear>(48, 48, g);
    model->emplace<ReLU>();
    model->emplace<Linear>(48, 10, g);
    return model;
  };
  auto cpu = make(), on_gpu = make();
  on_gpu->to(gpu);
  Adam cpu_opt(cpu->named_parameters(), 1e-2), gpu_opt(on_gpu->named_parameters(), 1e-2);
  CrossEntropyLoss cpu_loss, gpu_loss;
  tensor::Generator data(8);
  for (int step = 0; step < 10; ++step) {
    const Tensor x = tensor::uniform({32, 64}, 0, 1, data), y = labels(32, 10, static_cast<std::uint64_t>(step));
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    const double a = cpu_loss.forward(cpu->forward(x), y).item();
    const double b = gpu_loss.forward(on_gpu->forward(x.to(gpu)), y.to(gpu)).item();
    EXPECT_NEAR(b, a, 1e-4 * std::max(1.0, std::fabs(a))) << "step " << step;
    cpu->backward(cpu_loss.backward());
    on_gpu->backward(gpu_loss.backward());
    cpu_opt.step();
    gpu_opt.step();
  }
  const auto cpu_params = cpu->named_parameters(), gpu_params = on_gpu->named_parameters();
  for (std::size_t i = 0; i < cpu_params.size(); ++i) {
    EXPECT_EQ(gpu_params[i].param->data.device(), gpu);
    EXPECT_TRUE(tensor::allclose(gpu_params[i].param->data.to(Device::cpu()), cpu_params[i].param->data, 1e-4, 1e-5))
        << cpu_params[i].name;
  }
}
