#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::tensor;

namespace {
Tensor f32(std::vector<float> v, Shape s = {}) { return Tensor::from_vector<float>(v, std::move(s)); }

std::string error_message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidArgument";
  return {};
}

// Plain triple loop in double: the reference for matmul.
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  const auto m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1), n = tb ? b.size(0) : b.size(1);
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t p = 0; p < k; ++p)
        c[i * n + j] += x[ta ? p * m + i : i * k + p] * y[tb ? j * k + p : p * n + j];
  return c;
}
}  // namespace

TEST(Elementwise, ArithmeticOnEqualShapes) {
  const Tensor a = f32({1, 2, 3, 4}), b = f32({4, 3, 2, 1});
  EXPECT_EQ(add(a, b).to_vector<float>(), (std::vector<float>{5, 5, 5, 5}));
  EXPECT_EQ(sub(a, b).to_vector<float>(), (std::vector<float>{-3, -1, 1, 3}));
  EXPECT_EQ(mul(a, b).to_vector<float>(), (std::vector<float>{4, 6, 6, 4}));
  EXPECT_EQ(div(a, b).to_vector<float>(), (std::vector<float>{0.25, 2.0f / 3, 1.5, 4}));
  EXPECT_EQ((a * 2.0 + 1.0).to_vector<float>(), (std::vector<float>{3, 5, 7, 9}));
}

TEST(Elementwise, BroadcastsLikePyTorch) {
  const Tensor m = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(add(m, f32({10, 20, 30})).to_vector<float>(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(add(m, f32({100, 200}, {2, 1})).to_vector<float>(), (std::vector<float>{101, 102, 103, 204, 205, 206}));
  const Tensor outer = mul(f32({1, 2}, {2, 1, 1}), f32({1, 10, 100}, {1, 3}));
  EXPECT_EQ(outer.shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(outer.to_vector<float>(), (std::vector<float>{1, 10, 100, 2, 20, 200}));
  const Tensor grid = add(f32({1, 2, 3}, {3, 1}), f32({10, 20}, {1, 2}));
  EXPECT_EQ(grid.to_vector<float>(), (std::vector<float>{11, 21, 12, 22, 13, 23}));
  EXPECT_EQ(add(f32({5}, {}), m).to_vector<float>()[5], 11.0f);
}

TEST(Elementwise, InPlaceFormsWriteThroughViews) {
  Tensor buffer = Tensor::zeros({6});
  Tensor view = buffer.slice(2, 4);
  add_(view, f32({1, 2}));
  mul_(view, f32({3}, {}));
  EXPECT_EQ(buffer.to_vector<float>(), (std::vector<float>{0, 0, 3, 6, 0, 0}));
  Tensor y = f32({1, 1});
  axpy_(y, 0.5, f32({2, 4}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2, 3}));
  scale_(y, -2);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{-4, -6}));
  EXPECT_THROW(add_(view, Tensor::ones({3, 2})), InvalidArgument);  // would change view's shape
}

TEST(Elementwise, MismatchesNameTheOperationShapesAndDTypes) {
  auto msg = error_message_of([] { add(Tensor::ones({2, 3}), Tensor::ones({4})); });
  EXPECT_NE(msg.find("add"), std::string::npos);
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos);
  EXPECT_NE(msg.find("[4]"), std::string::npos);
  msg = error_message_of([] { mul(Tensor::ones({2}), Tensor::ones({2}, DType::f64)); });
  EXPECT_NE(msg.find("f32"), std::string::npos);
  EXPECT_NE(msg.find("f64"), std::string::npos);
  Tensor y = Tensor::ones({2});
  msg = error_message_of([&] { axpy_(y, 1, Tensor::ones({3})); });
  EXPECT_NE(msg.find("axpy_"), std::string::npos);
  EXPECT_THROW(div(Tensor::ones({2}, DType::i32), Tensor::zeros({2}, DType::i32)), InvalidArgument);
}

TEST(Elementwise, HalfPrecisionComputesInFloatAndRoundsOnce) {
  const Tensor a = Tensor::full({3}, 1, DType::bf16), b = Tensor::full({3}, 1.0 / 256, DType::bf16);
  // 1 + 2^-8 is a tie in bf16 and rounds to even (1); computing in bf16 twice would too,
  // so add a value that only exact f32 arithmetic keeps: (1 + 2^-8) * 2 = 2 + 2^-7.
  EXPECT_EQ(mul(add(a, b), Tensor::full({3}, 2, DType::bf16)).to_vector<float>()[0], 2.0f);
  const Tensor h = Tensor::full({2}, 0.1, DType::f16);
  EXPECT_NEAR(add(h, h).to_vector<float>()[0], 0.2f, 1e-3);
}

TEST(Elementwise, UnaryMathAndClamp) {
  const Tensor x = f32({1, 4, 9});
  EXPECT_EQ(sqrt(x).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_TRUE(allclose(log(exp(x)), x));
  EXPECT_EQ(neg(x).to_vector<float>(), (std::vector<float>{-1, -4, -9}));
  EXPECT_EQ(abs(f32({-2, 3})).to_vector<float>(), (std::vector<float>{2, 3}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto c = clamp(f32({-5, 0.5, 5, nan}), 0, 1).to_vector<float>();
  EXPECT_EQ(c[0], 0.0f);
  EXPECT_EQ(c[1], 0.5f);
  EXPECT_EQ(c[2], 1.0f);
  EXPECT_TRUE(std::isnan(c[3]));
  EXPECT_THROW(sqrt(Tensor::ones({2}, DType::i64)), InvalidArgument);
  EXPECT_THROW(clamp(x, 2, 1), InvalidArgument);
}

TEST(Compare, GivesU8MasksAndBroadcasts) {
  const Tensor a = f32({1, 2, 3});
  const Tensor r = gt(a, 1.5);
  EXPECT_EQ(r.dtype(), DType::u8);
  EXPECT_EQ(r.to_vector<int>(), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(eq(a, f32({1, 0, 3})).to_vector<int>(), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(le(a, f32({2}, {})).to_vector<int>(), (std::vector<int>{1, 1, 0}));
  EXPECT_EQ(ne(a, a).to_vector<int>(), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(ge(a, a).to_vector<int>(), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(lt(a, 2.0).to_vector<int>(), (std::vector<int>{1, 0, 0}));
}

TEST(Reduce, WholeTensor) {
  const Tensor x = f32({3, -1, 4, 1, -5, 9});
  EXPECT_EQ(sum(x).item(), 11.0);
  EXPECT_NEAR(mean(x).item(), 11.0 / 6, 1e-6);
  EXPECT_EQ(max(x).item(), 9.0);
  EXPECT_EQ(min(x).item(), -5.0);
  EXPECT_NEAR(norm(x).item(), std::sqrt(133.0), 1e-5);
  EXPECT_EQ(sum(x).dim(), 0);
  const Tensor ints = Tensor::arange(0, 100, 1, DType::u8);
  EXPECT_EQ(sum(ints).dtype(), DType::i64);  // 4950 would overflow u8
  EXPECT_EQ(sum(ints).item(), 4950.0);
  EXPECT_EQ(sum(Tensor::zeros({0})).item(), 0.0);
}

TEST(Reduce, AlongEachDimensionWithAndWithoutKeepdim) {
  const Tensor x = Tensor::arange(0, 24, 1, DType::f64).reshape({2, 3, 4});
  EXPECT_EQ(sum(x, 0).shape(), (Shape{3, 4}));
  EXPECT_EQ(sum(x, 0).to_vector<double>()[0], 12.0);
  EXPECT_EQ(sum(x, 1, true).shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(sum(x, 1).to_vector<double>()[0], 0.0 + 4 + 8);
  EXPECT_EQ(max(x, -1).to_vector<double>(), (std::vector<double>{3, 7, 11, 15, 19, 23}));
  EXPECT_EQ(min(x, 2).to_vector<double>()[1], 4.0);
  EXPECT_EQ(mean(x, 2).to_vector<double>()[0], 1.5);
  EXPECT_NEAR(norm(x, 2).to_vector<double>()[0], std::sqrt(14.0), 1e-12);
  EXPECT_THROW(sum(x, 3), InvalidArgument);
}

TEST(Reduce, ArgmaxTakesTheFirstOfTiesAndPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = f32({1, 5, 5, 2, nan, 7}, {2, 3});
  const Tensor idx = argmax(x, 1);
  EXPECT_EQ(idx.dtype(), DType::i64);
  EXPECT_EQ(idx.to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 1}));
  EXPECT_TRUE(std::isnan(max(x).item()));
  EXPECT_THROW(max(Tensor::zeros({0})), InvalidArgument);
  EXPECT_THROW(mean(Tensor::ones({2}, DType::i32)), InvalidArgument);
}

TEST(Reduce, SumsOfLongF32TensorsKeepTheirDigits) {
  // 2^24 + 1 ones: an f32 accumulator would stop at 2^24.
  const Tensor ones = Tensor::ones({(1 << 24) + 1});
  EXPECT_EQ(sum(ones).to(DType::f64).item(), 16777216.0);  // the f32 result rounds once, at the end
  EXPECT_EQ(sum(ones.to(DType::f64)).item(), 16777217.0);
  EXPECT_EQ(mean(ones).item(), 1.0);
}

TEST(Matmul, MatchesAPlainLoopForEveryTransposeAndDType) {
  Generator g(9);
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = normal(ta ? Shape{7, 5} : Shape{5, 7}, 0, 1, g, t);
        const Tensor b = normal(tb ? Shape{3, 7} : Shape{7, 3}, 0, 1, g, t);
        const Tensor c = matmul(a, b, ta ? Transpose::yes : Transpose::no, tb ? Transpose::yes : Transpose::no);
        ASSERT_EQ(c.shape(), (Shape{5, 3}));
        const auto expected = reference_matmul(a, b, ta, tb);
        const double tol = t == DType::bf16 ? 3e-2 : t == DType::f16 ? 4e-3 : 1e-5;
        EXPECT_TRUE(allclose(c.to(DType::f64), Tensor::from_vector(expected, {5, 3}), tol, tol)) << t << ta << tb;
      }
  }
  const Tensor ia = Tensor::arange(0, 6, 1, DType::i32).reshape({2, 3});
  EXPECT_EQ(matmul(ia, ia, Transpose::no, Transpose::yes).to_vector<int>(), (std::vector<int>{5, 14, 14, 50}));
}

TEST(Matmul, OutAccumulatesWithBetaIntoAView) {
  Tensor bucket = Tensor::ones({10});
  Tensor out = bucket.slice(2, 6).reshape({2, 2});
  const Tensor a = f32({1, 2, 3, 4}, {2, 2}), eye = f32({1, 0, 0, 1}, {2, 2});
  matmul_out(out, a, eye, Transpose::no, Transpose::no, 2.0, 1.0);
  EXPECT_EQ(bucket.to_vector<float>(), (std::vector<float>{1, 1, 3, 5, 7, 9, 1, 1, 1, 1}));
}

TEST(Matmul, EmptyInnerDimensionGivesZerosAndBadShapesAreNamed) {
  EXPECT_EQ(matmul(Tensor::ones({2, 0}), Tensor::ones({0, 3})).to_vector<float>(), std::vector<float>(6, 0.0f));
  const auto msg = error_message_of([] { matmul(Tensor::ones({4, 3}), Tensor::ones({5, 2})); });
  EXPECT_NE(msg.find("inner dimensions"), std::string::npos);
  EXPECT_NE(msg.find("[4, 3]"), std::string::npos);
  EXPECT_NE(msg.find("[5, 2]"), std::string::npos);
  EXPECT_THROW(matmul(Tensor::ones({4}), Tensor::ones({4, 1})), InvalidArgument);
  Tensor wrong = Tensor::zeros({3, 3});
  EXPECT_THROW(matmul_out(wrong, Tensor::ones({2, 2}), Tensor::ones({2, 2})), InvalidArgument);
  Tensor a = Tensor::ones({2, 2});
  EXPECT_THROW(matmul_out(a, a, Tensor::ones({2, 2})), InvalidArgument);  // aliasing
}

TEST(Allclose, UsesRelativeAndAbsoluteToleranceAndRejectsNaN) {
  EXPECT_TRUE(allclose(f32({1, 100}), f32({1.000001f, 100.0001f})));
  EXPECT_FALSE(allclose(f32({1}), f32({1.1f})));
  EXPECT_FALSE(allclose(f32({1, 2}), f32({1})));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(allclose(f32({nan}), f32({nan})));
  EXPECT_TRUE(equal(f32({nan}), f32({nan})));  // same bytes
}
