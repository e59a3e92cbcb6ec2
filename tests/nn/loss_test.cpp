// Losses: forward against hand-computed values, backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.hpp"
#include "troupe/nn/loss.hpp"

using namespace troupe;
using namespace troupe::nn;
using tensor::Generator;

namespace {

Tensor randn_f64(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  return tensor::normal(shape, 0, 1, gen, DType::f64);
}

Tensor targets(std::vector<std::int64_t> values) { return Tensor::from_vector(values); }

// Checks CrossEntropyLoss.backward against finite differences of its forward.
void expect_cross_entropy_gradient(CrossEntropyLoss& loss, const Tensor& logits, const Tensor& target,
                                   double scale = 1.0) {
  loss.forward(logits, target);
  const Tensor analytic = loss.backward(scale);
  gradcheck::expect_gradient([&] { return scale * loss.forward(logits, target).item(); }, logits, analytic,
                             "CrossEntropyLoss logits");
}

}  // namespace

TEST(CrossEntropyLoss, ForwardMatchesAHandComputedValue) {
  CrossEntropyLoss loss;
  // log(e^1 + e^2 + e^3) - 3
  const Tensor one = loss.forward(Tensor::from_vector<double>({1, 2, 3}, {1, 3}), targets({2}));
  EXPECT_EQ(one.dim(), 0);
  EXPECT_NEAR(one.item(), 0.40760596444438013, 1e-15);
  const Tensor two = loss.forward(Tensor::from_vector<double>({1, 2, 3, 0.5, -1, 2}, {2, 3}), targets({2, 0}));
  EXPECT_NEAR(two.item(), 1.0744586305507686, 1e-15);
}

TEST(CrossEntropyLoss, LabelSmoothingFollowsPyTorchsFormula) {
  // (1 - eps) * nll + eps * mean over classes of -log p
  CrossEntropyLoss smooth(-100, 0.1);
  EXPECT_NEAR(smooth.forward(Tensor::from_vector<double>({1, 2, 3}, {1, 3}), targets({2})).item(), 0.5076059644443801,
              1e-15);
  CrossEntropyLoss smoother(-100, 0.2);
  EXPECT_NEAR(smoother.forward(Tensor::from_vector<double>({1, 2, 3, 0.5, -1, 2}, {2, 3}), targets({2, 0})).item(),
              1.1744586305507687, 1e-15);
}

TEST(CrossEntropyLoss, IgnoredTargetsDropOutOfTheMean) {
  CrossEntropyLoss loss(-1);
  const Tensor logits = Tensor::from_vector<double>({1, 2, 3, 0.5, -1, 2}, {2, 3});
  EXPECT_NEAR(loss.forward(logits, targets({2, -1})).item(), 0.40760596444438013, 1e-15);
  const auto grad = loss.backward().to_vector<double>();
  for (int c = 3; c < 6; ++c) EXPECT_EQ(grad[static_cast<std::size_t>(c)], 0.0);
}

TEST(CrossEntropyLoss, AllTargetsIgnoredGivesNanLikePyTorchAndAZeroGradient) {
  CrossEntropyLoss loss;
  EXPECT_TRUE(std::isnan(loss.forward(randn_f64({2, 3}, 1), targets({-100, -100})).item()));
  EXPECT_EQ(tensor::sum(tensor::abs(loss.backward())).item(), 0.0);
}

TEST(CrossEntropyLoss, BackwardMatchesFiniteDifferencesInF64) {
  CrossEntropyLoss loss;
  expect_cross_entropy_gradient(loss, randn_f64({4, 5}, 2), targets({0, 4, 2, 2}));
}

TEST(CrossEntropyLoss, BackwardWithIgnoreIndexAndLabelSmoothingMatchesFiniteDifferences) {
  CrossEntropyLoss loss(3, 0.15);
  expect_cross_entropy_gradient(loss, randn_f64({5, 4}, 3), targets({0, 3, 1, 3, 2}));
}

TEST(CrossEntropyLoss, BackwardScaleMultipliesTheGradient) {
  CrossEntropyLoss loss(-100, 0.1);
  expect_cross_entropy_gradient(loss, randn_f64({3, 4}, 4), targets({1, 0, 3}), 0.25);
}

TEST(CrossEntropyLoss, AcceptsLeadingDimensionsAsRows) {
  CrossEntropyLoss loss;
  const Tensor logits = randn_f64({2, 3, 4}, 5);
  const Tensor target = Tensor::from_vector<std::int64_t>({0, 1, 2, 3, 0, 1}, {2, 3});
  const double batched = loss.forward(logits, target).item();
  EXPECT_DOUBLE_EQ(batched, loss.forward(logits.reshape({6, 4}), target.reshape({6})).item());
  expect_cross_entropy_gradient(loss, logits, target);
}

TEST(CrossEntropyLoss, IsStableForHugeLogits) {
  CrossEntropyLoss loss;
  const Tensor logits = Tensor::from_vector<float>({1000, 0, -1000, 1000}, {2, 2});
  const double value = loss.forward(logits, targets({0, 0})).item();
  EXPECT_NEAR(value, (0.0 + 2000.0) / 2, 1e-3);
  EXPECT_TRUE(std::isfinite(tensor::sum(loss.backward()).item()));
}

// f32 logits take the vectorised rows (math_loops): the f64 path's loss and gradient,
// to f32's precision, with ignored rows and label smoothing, at 5 and 5000 classes.
TEST(CrossEntropyLoss, F32RowsMatchTheF64Path) {
  for (const std::int64_t classes : {5, 5000}) {
    const Tensor logits64 = tensor::mul(randn_f64({6, classes}, 11), 3.0);
    const Tensor logits32 = logits64.to(DType::f32);
    const Tensor target = targets({0, classes - 1, -1, 2, classes / 2, 1});
    for (const double eps : {0.0, 0.1}) {
      CrossEntropyLoss loss64(-1, eps), loss32(-1, eps);
      // The same f32 values in both: the difference is the arithmetic alone.
      const double want = loss64.forward(logits32.to(DType::f64), target).item();
      const Tensor got = loss32.forward(logits32, target);
      EXPECT_EQ(got.dtype(), DType::f32);
      EXPECT_NEAR(got.item(), want, 1e-6 * std::fabs(want)) << classes << " classes, eps " << eps;
      const auto g64 = loss64.backward(2.0).to_vector<double>();
      const auto g32 = loss32.backward(2.0).to_vector<float>();
      ASSERT_EQ(g32.size(), g64.size());
      for (std::size_t i = 0; i < g32.size(); ++i) {
        if (i / static_cast<std::size_t>(classes) == 2) {
          ASSERT_EQ(g32[i], 0.0f) << "ignored row, element " << i;
        }
        // (p - q) * 2 / 5: p and q at most 1, each within a few f32 ulps.
        ASSERT_NEAR(g32[i], g64[i], 1e-6 * 2.0 / 5) << classes << " classes, eps " << eps << ", element " << i;
      }
    }
  }
}

TEST(CrossEntropyLoss, OutOfRangeTargetNamesTheIndex) {
  CrossEntropyLoss loss;
  try {
    loss.forward(randn_f64({2, 3}, 6), targets({1, 7}));
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("target 7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 classes"), std::string::npos) << msg;
  }
  EXPECT_THROW(loss.forward(randn_f64({2, 3}, 6), targets({1, -5})), InvalidArgument);
  EXPECT_THROW(loss.forward(randn_f64({2, 3}, 6), targets({1, 2, 0})), InvalidArgument);
  EXPECT_THROW(CrossEntropyLoss(-100, 1.5), InvalidArgument);
  CrossEntropyLoss fresh;
  EXPECT_THROW(fresh.backward(), InvalidArgument);
}

TEST(MSELoss, ForwardIsTheMeanSquaredError) {
  MSELoss loss;
  const Tensor value = loss.forward(Tensor::from_vector<double>({1, 2, 3}), Tensor::from_vector<double>({1, 0, 6}));
  EXPECT_DOUBLE_EQ(value.item(), (0.0 + 4.0 + 9.0) / 3);
  EXPECT_THROW(loss.forward(Tensor::zeros({3}), Tensor::zeros({4})), InvalidArgument);
}

TEST(MSELoss, BackwardMatchesFiniteDifferencesInF64) {
  MSELoss loss;
  const Tensor input = randn_f64({3, 4}, 7), target = randn_f64({3, 4}, 8);
  loss.forward(input, target);
  const Tensor analytic = loss.backward(0.5);
  gradcheck::expect_gradient([&] { return 0.5 * loss.forward(input, target).item(); }, input, analytic, "MSELoss");
}

TEST(Accuracy, CountsArgmaxHitsAmongNonIgnoredRows) {
  const Tensor logits = Tensor::from_vector<float>({0.1f, 0.9f, 0.8f, 0.2f, 0.3f, 0.7f, 0.6f, 0.4f}, {4, 2});
  EXPECT_DOUBLE_EQ(accuracy(logits, targets({1, 0, 0, 0})), 0.75);
  EXPECT_DOUBLE_EQ(accuracy(logits, targets({1, -100, 0, 0}), -100), 2.0 / 3.0);
}
