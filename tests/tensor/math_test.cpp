// The activation-style math ops on the host (their CUDA twins are in cuda_ops_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "troupe/tensor/ops.hpp"

using namespace troupe;
using namespace troupe::tensor;

TEST(MathOps, TanhSigmoidReluAndGeluFollowTheirFormulas) {
  const std::vector<double> xs = {-3, -0.5, 0, 0.25, 2};
  const Tensor x = Tensor::from_vector(xs).to(DType::f32);
  const auto th = tanh(x).to_vector<double>(), sg = sigmoid(x).to_vector<double>();
  const auto re = relu(x).to_vector<double>(), ge = gelu(x).to_vector<double>(), gt = gelu(x, true).to_vector<double>();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    EXPECT_NEAR(th[i], std::tanh(v), 1e-6);
    EXPECT_NEAR(sg[i], 1 / (1 + std::exp(-v)), 1e-6);
    EXPECT_EQ(re[i], v > 0 ? v : 0);
    EXPECT_NEAR(ge[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-6);
    EXPECT_NEAR(gt[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-6);
  }
}

TEST(MathOps, ReluOfNaNIsZeroAndMathNeedsAFloatingDType) {
  const Tensor x = Tensor::from_vector<float>({std::numeric_limits<float>::quiet_NaN()});
  EXPECT_EQ(relu(x).item(), 0);
  EXPECT_THROW(tanh(Tensor::zeros({2}, DType::i32)), InvalidArgument);
}
