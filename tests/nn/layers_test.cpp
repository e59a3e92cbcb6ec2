// Layers: forward values, PyTorch init, and every backward against central finite
// differences in f64.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/layer_norm.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/sequential.hpp"

using namespace troupe;
using namespace troupe::nn;
using gradcheck::expect_module_gradients;
using tensor::Generator;

namespace {

Tensor randn(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  return tensor::normal(shape, 0, 1, gen, DType::f64);
}

template <class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

// ---- Linear ----

TEST(Linear, WeightIsOutByInAndInitWithinPyTorchBounds) {
  Generator gen(7);
  Linear fc(16, 5, gen);
  ASSERT_EQ(fc.weight().data.shape(), Shape({5, 16}));
  ASSERT_EQ(fc.bias()->data.shape(), Shape({5}));
  const double bound = 1.0 / std::sqrt(16.0);
  for (const Tensor& t : {fc.weight().data, fc.bias()->data}) {
    EXPECT_LE(tensor::max(t).item(), bound);
    EXPECT_GE(tensor::min(t).item(), -bound);
    EXPECT_GT(tensor::max(t).item(), 0.5 * bound);  // uses the range, not a tiny corner of it
  }
}

TEST(Linear, SameSeedGivesTheSameWeightsAndAnotherSeedDoesNot) {
  Generator a(3), b(3), c(4);
  Linear x(8, 4, a), y(8, 4, b), z(8, 4, c);
  EXPECT_TRUE(tensor::equal(x.weight().data, y.weight().data));
  EXPECT_TRUE(tensor::equal(x.bias()->data, y.bias()->data));
  EXPECT_FALSE(tensor::equal(x.weight().data, z.weight().data));
}

TEST(Linear, AcceptsPyTorchArgumentOrderAndNoBias) {
  Generator gen(1);
  Linear fc(3, 2, false, gen, DType::f64);
  EXPECT_EQ(fc.bias(), nullptr);
  EXPECT_EQ(fc.named_parameters().size(), 1u);
  EXPECT_EQ(fc.weight().data.dtype(), DType::f64);
}

TEST(Linear, ForwardComputesXTimesWTransposedPlusBias) {
  Generator gen(1);
  Linear fc(2, 3, gen, true, DType::f64);
  fc.weight().data.copy_(Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}));
  fc.bias()->data.copy_(Tensor::from_vector<double>({0.1, 0.2, 0.3}));
  const Tensor y = fc.forward(Tensor::from_vector<double>({1, -1}, {1, 2}));
  EXPECT_EQ(y.shape(), Shape({1, 3}));
  const auto v = y.to_vector<double>();
  EXPECT_DOUBLE_EQ(v[0], -0.9);
  EXPECT_DOUBLE_EQ(v[1], -0.8);
  EXPECT_DOUBLE_EQ(v[2], -0.7);
}

TEST(Linear, BackwardMatchesFiniteDifferencesInF64) {
  Generator gen(11);
  Linear fc(4, 3, gen, true, DType::f64);
  expect_module_gradients(fc, randn({5, 4}, 1));
}

TEST(Linear, BackwardWithoutBiasMatchesFiniteDifferences) {
  Generator gen(11);
  Linear fc(4, 3, gen, false, DType::f64);
  expect_module_gradients(fc, randn({2, 4}, 2));
}

TEST(Linear, FlattensLeadingDimensionsForwardAndBackward) {
  Generator gen(5);
  Linear fc(3, 2, gen, true, DType::f64);
  const Tensor x = randn({2, 4, 3}, 3);
  EXPECT_EQ(fc.forward(x).shape(), Shape({2, 4, 2}));
  expect_module_gradients(fc, x);
}

TEST(Linear, RejectsAnInputOfTheWrongWidthOrDtype) {
  Generator gen(5);
  Linear fc(3, 2, gen);
  const std::string msg = message_of([&] { fc.forward(Tensor::zeros({4, 5})); });
  EXPECT_NE(msg.find("Linear(3 -> 2)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 5]"), std::string::npos) << msg;
  EXPECT_THROW(fc.forward(Tensor::zeros({4, 3}, DType::f64)), InvalidArgument);
  Linear fresh(3, 2, gen);
  EXPECT_THROW(fresh.backward(Tensor::zeros({4, 2})), InvalidArgument);
}

// ---- activations ----

TEST(ReLU, BackwardMatchesFiniteDifferencesAwayFromZero) {
  ReLU relu;
  Tensor x = randn({3, 5}, 4);
  double* p = x.data<double>();
  for (std::int64_t i = 0; i < x.numel(); ++i) p[i] += p[i] >= 0 ? 0.1 : -0.1;  // keep off the kink
  expect_module_gradients(relu, x);
  const auto y = relu.forward(Tensor::from_vector<double>({-1, 0, 2})).to_vector<double>();
  EXPECT_EQ(y, (std::vector<double>{0, 0, 2}));
}

TEST(GELU, ExactFormMatchesErfValues) {
  GELU gelu;
  const auto y = gelu.forward(Tensor::from_vector<double>({1.0, -0.5})).to_vector<double>();
  EXPECT_NEAR(y[0], 0.8413447460685429, 1e-15);
  EXPECT_NEAR(y[1], -0.15426876936299344, 1e-15);
}

TEST(GELU, TanhFormMatchesGpt2Values) {
  GELU gelu("tanh");
  EXPECT_EQ(gelu.approximate(), GeluApproximate::tanh);
  const auto y = gelu.forward(Tensor::from_vector<double>({1.0, -0.5})).to_vector<double>();
  EXPECT_NEAR(y[0], 0.8411919906082768, 1e-15);
  EXPECT_NEAR(y[1], -0.15428599017485606, 1e-15);
  EXPECT_THROW(GELU("fast"), InvalidArgument);
}

TEST(GELU, ExactBackwardMatchesFiniteDifferencesInF64) {
  GELU gelu;
  expect_module_gradients(gelu, randn({4, 6}, 5));
}

TEST(GELU, TanhBackwardMatchesFiniteDifferencesInF64) {
  GELU gelu(GeluApproximate::tanh);
  expect_module_gradients(gelu, randn({4, 6}, 6));
}

TEST(Tanh, BackwardMatchesFiniteDifferencesInF64) {
  Tanh tanh_layer;
  expect_module_gradients(tanh_layer, randn({3, 7}, 7));
}

TEST(Activations, RunInF32Too) {
  GELU gelu;
  const auto y = gelu.forward(Tensor::from_vector<float>({1.0f})).to_vector<float>();
  EXPECT_NEAR(y[0], 0.8413447f, 1e-6f);
  EXPECT_EQ(gelu.backward(Tensor::ones({1})).dtype(), DType::f32);
}

// ---- Dropout ----

TEST(Dropout, BackwardMatchesFiniteDifferencesWithAFixedMask) {
  Dropout dropout(0.3, 99);
  const Tensor x = randn({4, 8}, 8);
  // Rewinding the generator before each forward replays the same mask.
  expect_module_gradients(dropout, x, {.before_forward = [&] { dropout.generator().set_state(99, 0); }});
}

TEST(Dropout, KeepsAboutOneMinusPAndScalesKeptValues) {
  Dropout dropout(0.25, 1);
  const Tensor y = dropout.forward(Tensor::ones({10000}));
  std::int64_t kept = 0;
  for (float v : y.to_vector<float>()) {
    if (v != 0) {
      ++kept;
      ASSERT_FLOAT_EQ(v, 1.0f / 0.75f);
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / 10000, 0.75, 0.02);
}

TEST(Dropout, SameGeneratorStateGivesTheSameMaskAndTheStateAdvances) {
  Dropout a(0.5, 42), b(0.5, 42);
  const Tensor x = Tensor::ones({64});
  const Tensor first = a.forward(x);
  EXPECT_TRUE(tensor::equal(first, b.forward(x)));
  const auto offset = a.generator().offset();
  EXPECT_GT(offset, 0u);
  const Tensor second = a.forward(x);
  EXPECT_FALSE(tensor::equal(first, second));  // a new mask each step
  a.generator().set_state(42, offset);         // as a resumed run would
  EXPECT_TRUE(tensor::equal(a.forward(x), second));
}

TEST(Dropout, IsTheIdentityInEvalModeAndWithPZero) {
  Dropout dropout(0.9, 3);
  dropout.eval();
  const Tensor x = randn({5, 5}, 9);
  EXPECT_TRUE(tensor::equal(dropout.forward(x), x));
  EXPECT_TRUE(tensor::equal(dropout.backward(x), x));
  Dropout none(0.0, 3);
  EXPECT_TRUE(tensor::equal(none.forward(x), x));
}

TEST(Dropout, PEqualToOneDropsEverythingAndOutOfRangePIsRejected) {
  Dropout all(1.0, 3);
  EXPECT_EQ(tensor::sum(tensor::abs(all.forward(Tensor::ones({100})))).item(), 0.0);
  EXPECT_THROW(Dropout(1.5), InvalidArgument);
  EXPECT_THROW(Dropout(-0.1), InvalidArgument);
}

// ---- LayerNorm ----

TEST(LayerNorm, NormalizesEachRowOverTheLastDimension) {
  LayerNorm norm(4, 1e-5, true, DType::f64);
  const auto y = norm.forward(Tensor::from_vector<double>({1, 2, 3, 4}, {1, 4})).to_vector<double>();
  const double rstd = 1 / std::sqrt(1.25 + 1e-5);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[static_cast<std::size_t>(i)], (i + 1 - 2.5) * rstd, 1e-15);
  const auto names = norm.named_parameters();
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].name, "weight");
  EXPECT_EQ(names[1].name, "bias");
}

TEST(LayerNorm, BackwardMatchesFiniteDifferencesInF64) {
  LayerNorm norm(6, 1e-5, true, DType::f64);
  // Move weight and bias off ones and zeros so their gradients are exercised fully.
  norm.weight()->data.copy_(randn({6}, 10));
  norm.bias()->data.copy_(randn({6}, 11));
  expect_module_gradients(norm, randn({2, 3, 6}, 12));
}

TEST(LayerNorm, WithoutAffineHasNoParametersAndBackwardMatches) {
  LayerNorm norm(5, 1e-5, false, DType::f64);
  EXPECT_EQ(norm.parameter_count(), 0);
  expect_module_gradients(norm, randn({3, 5}, 13));
}

// ---- Embedding ----

TEST(Embedding, LooksUpRowsAndKeepsTheIndexShape) {
  Generator gen(2);
  Embedding emb(10, 3, gen, DType::f64);
  const Tensor idx = Tensor::from_vector<std::int64_t>({4, 0, 4, 9}, {2, 2});
  const Tensor y = emb.forward(idx);
  ASSERT_EQ(y.shape(), Shape({2, 2, 3}));
  EXPECT_TRUE(tensor::equal(y[0][0], emb.weight().data[4]));
  EXPECT_TRUE(tensor::equal(y[1][1], emb.weight().data[9]));
}

TEST(Embedding, InitIsStandardNormal) {
  Generator gen(2);
  Embedding emb(200, 50, gen);
  EXPECT_NEAR(tensor::mean(emb.weight().data).item(), 0.0, 0.02);
  const double var = tensor::mean(tensor::mul(emb.weight().data, emb.weight().data)).item();
  EXPECT_NEAR(var, 1.0, 0.03);
}

TEST(Embedding, WeightGradientMatchesFiniteDifferencesWithRepeatedIndices) {
  Generator gen(2);
  Embedding emb(5, 3, gen, DType::f64);
  const Tensor idx = Tensor::from_vector<std::int64_t>({1, 3, 1, 0, 1, 4}, {2, 3});
  expect_module_gradients(emb, idx);
  EXPECT_FALSE(emb.backward(randn({2, 3, 3}, 1)).defined());  // indices have no gradient
}

TEST(Embedding, OutOfRangeIndexNamesTheIndexAndTheTableSize) {
  Generator gen(2);
  Embedding emb(10, 3, gen);
  const std::string msg = message_of([&] { emb.forward(Tensor::from_vector<std::int64_t>({1, 12, 3})); });
  EXPECT_NE(msg.find("index 12"), std::string::npos) << msg;
  EXPECT_NE(msg.find("10 rows"), std::string::npos) << msg;
  EXPECT_THROW(emb.forward(Tensor::from_vector<std::int64_t>({-1})), InvalidArgument);
  EXPECT_THROW(emb.forward(Tensor::zeros({2})), InvalidArgument);  // f32 indices
}

// ---- Sequential ----

TEST(Sequential, BackwardThroughLayersMatchesFiniteDifferencesInF64) {
  Generator gen(21);
  Sequential model;
  model.emplace<Linear>(4, 6, gen, true, DType::f64);
  model.emplace<LayerNorm>(6, 1e-5, true, DType::f64);
  model.emplace<GELU>();
  model.emplace<Linear>(6, 3, gen, true, DType::f64);
  model.emplace<Tanh>();
  expect_module_gradients(model, randn({3, 4}, 22));
}

TEST(Sequential, NamesChildrenByPositionAndReturnsTypedReferences) {
  Generator gen(21);
  Sequential model;
  Linear& first = model.add(std::make_shared<Linear>(2, 3, gen));
  model.emplace<ReLU>();
  model.emplace<Linear>(3, 1, gen);
  EXPECT_EQ(&first, &model[0]);
  EXPECT_EQ(model.size(), 3u);
  const auto children = model.named_children();
  ASSERT_EQ(children.size(), 3u);
  EXPECT_EQ(children[1].name, "1");
  EXPECT_EQ(children[1].module->type_name(), "ReLU");
  EXPECT_THROW(model[3], InvalidArgument);
}
