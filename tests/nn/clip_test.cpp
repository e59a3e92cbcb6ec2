#include <gtest/gtest.h>

#include <cmath>

#include "troupe/nn/clip.hpp"
#include "troupe/tensor/ops.hpp"

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
