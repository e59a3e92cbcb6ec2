// Every tensor op that has a CUDA kernel, run on the GPU and on the CPU from the same
// inputs and compared (gpu_compare.hpp's tolerances). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "gpu_compare.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::tensor;
using troupe::tensor::testing::matches_cpu;

namespace {

constexpr DType kFloating[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

Tensor random_input(const Shape& shape, DType t, std::uint64_t seed, double scale = 2) {
  Generator g(seed);
  Tensor x = normal(shape, 0, scale, g);
  if (!is_floating(t)) x = mul(x, 10.0);  // integers: a spread of values, rounded toward zero by the cast
  return x.to(t);
}

const Device kGpu = Device::cuda();

}  // namespace

TEST(CudaOps, UnaryMathMatchesTheCpuInEveryFloatingDType) {
  TROUPE_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }},
      {"sqrt", [](const Tensor& x) { return sqrt(add(abs(x), 0.1)); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(add(abs(x), 0.1)); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, true); }},
  };
  for (DType t : kFloating) {
    const Tensor x = random_input({3, 1001}, t, 11);
    for (const auto& [name, op] : ops) EXPECT_TRUE(matches_cpu(op(x.to(kGpu)), op(x))) << name << " " << t;
  }
}

TEST(CudaOps, NegAbsAndClampWorkOnIntegers) {
  TROUPE_SKIP_WITHOUT_GPU();
  for (DType t : {DType::i32, DType::i64}) {
    const Tensor x = random_input({777}, t, 12);
    EXPECT_TRUE(matches_cpu(neg(x.to(kGpu)), neg(x))) << t;
    EXPECT_TRUE(matches_cpu(abs(x.to(kGpu)), abs(x))) << t;
    EXPECT_TRUE(matches_cpu(clamp(x.to(kGpu), -5, 7), clamp(x, -5, 7))) << t;
  }
}

TEST(CudaOps, ArithmeticBroadcastsLikeTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{5, 7}, {5, 7}},    {{5, 7}, {}},     {{}, {5, 7}},
      {{5, 7}, {7}},       {{5, 1}, {1, 7}}, {{2, 3, 4}, {3, 1}},
      {{4, 1, 3}, {2, 1}}, {{1}, {6, 5}},    {{2, 1, 3, 1, 2}, {4, 1, 5, 1}}};
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    for (const auto& [sa, sb] : shapes) {
      const Tensor a = random_input(sa, t, 21), b = random_input(sb, t, 22);
      const Tensor divisor = add(abs(b), is_floating(t) ? 0.5 : 1.0);
      const Tensor ga = a.to(kGpu), gb = b.to(kGpu), gd = divisor.to(kGpu);
      const std::string where = to_string(sa) + " " + to_string(sb) + " " + std::string(dtype_name(t));
      EXPECT_TRUE(matches_cpu(add(ga, gb), add(a, b))) << "add " << where;
      EXPECT_TRUE(matches_cpu(sub(ga, gb), sub(a, b))) << "sub " << where;
      EXPECT_TRUE(matches_cpu(mul(ga, gb), mul(a, b))) << "mul " << where;
      EXPECT_TRUE(matches_cpu(div(ga, gd), div(a, divisor))) << "div " << where;
      EXPECT_TRUE(matches_cpu(gt(ga, gb), gt(a, b))) << "gt " << where;
      EXPECT_TRUE(matches_cpu(le(ga, gb), le(a, b))) << "le " << where;
    }
  }
}

TEST(CudaOps, ComparisonsWriteU8LikeTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  // Rounded values so that equal elements occur and eq/ne/le/ge are all exercised.
  const Tensor a = random_input({64, 9}, DType::i32, 31).to(DType::f32);
  const Tensor b = random_input({9}, DType::i32, 32).to(DType::f32);
  const Tensor ga = a.to(kGpu), gb = b.to(kGpu);
  EXPECT_TRUE(matches_cpu(eq(ga, gb), eq(a, b)));
  EXPECT_TRUE(matches_cpu(ne(ga, gb), ne(a, b)));
  EXPECT_TRUE(matches_cpu(lt(ga, gb), lt(a, b)));
  EXPECT_TRUE(matches_cpu(ge(ga, gb), ge(a, b)));
  EXPECT_TRUE(matches_cpu(gt(ga, 0.0), gt(a, 0.0)));
  EXPECT_TRUE(matches_cpu(lt(ga, 1.0), lt(a, 1.0)));
}

TEST(CudaOps, InPlaceFormsBroadcastIntoTheTarget) {
  TROUPE_SKIP_WITHOUT_GPU();
  Tensor a = random_input({8, 5}, DType::f32, 41);
  const Tensor bias = random_input({5}, DType::f32, 42), column = random_input({8, 1}, DType::f32, 43);
  Tensor ga = a.to(kGpu);
  add_(ga, bias.to(kGpu));
  mul_(ga, column.to(kGpu));
  add_(ga, 0.25);
  add_(a, bias);
  mul_(a, column);
  add_(a, 0.25);
  EXPECT_TRUE(matches_cpu(ga, a));
}

TEST(CudaOps, IntegerDivisionByZeroIsCaughtBeforeTheKernel) {
  TROUPE_SKIP_WITHOUT_GPU();
  const Tensor a = Tensor::from_vector<std::int64_t>({4, 5, 6}, {}, kGpu);
  const Tensor b = Tensor::from_vector<std::int64_t>({1, 0, 2}, {}, kGpu);
  EXPECT_THROW(div(a, b), InvalidArgument);
}

TEST(CudaReduce, WholeTensorReductionsMatchTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  for (std::int64_t n : {1, 7, 1000, 300001}) {
    for (DType t : kFloating) {
      const Tensor x = random_input({n}, t, 51), g = x.to(kGpu);
      EXPECT_TRUE(matches_cpu(sum(g), sum(x))) << "sum " << n << " " << t;
      EXPECT_TRUE(matches_cpu(mean(g), mean(x))) << "mean " << n << " " << t;
      EXPECT_TRUE(matches_cpu(max(g), max(x))) << "max " << n << " " << t;
      EXPECT_TRUE(matches_cpu(min(g), min(x))) << "min " << n << " " << t;
      EXPECT_TRUE(matches_cpu(norm(g), norm(x))) << "norm " << n << " " << t;
    }
    for (DType t : {DType::i32, DType::i64, DType::u8}) {
      const Tensor x = abs(random_input({n}, DType::i32, 52)).to(t), g = x.to(kGpu);
      EXPECT_TRUE(matches_cpu(sum(g), sum(x))) << "sum " << n << " " << t;  // i64 result
      EXPECT_TRUE(matches_cpu(max(g), max(x))) << "max " << n << " " << t;
      EXPECT_TRUE(matches_cpu(min(g), min(x))) << "min " << n << " " << t;
    }
  }
}

TEST(CudaReduce, ReductionsAlongEachDimensionMatchTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  // [6, 1000, 3]: dim 0 and 1 take the column kernel (inner > 1), dim 2 the row kernel;
  // [3, 100000] along dim 1 splits each row into parts.
  for (const Shape& shape : {Shape{6, 1000, 3}, Shape{3, 100000}, Shape{2, 0, 4}}) {
    for (DType t : kFloating) {
      const Tensor x = random_input(shape, t, 61), g = x.to(kGpu);
      for (std::int64_t dim = -1; dim < static_cast<std::int64_t>(shape.size()); ++dim) {
        for (bool keepdim : {false, true}) {
          const std::string where = to_string(shape) + " dim " + std::to_string(dim) + " " + std::string(dtype_name(t));
          EXPECT_TRUE(matches_cpu(sum(g, dim, keepdim), sum(x, dim, keepdim))) << "sum " << where;
          EXPECT_TRUE(matches_cpu(mean(g, dim, keepdim), mean(x, dim, keepdim))) << "mean " << where;
          EXPECT_TRUE(matches_cpu(norm(g, dim, keepdim), norm(x, dim, keepdim))) << "norm " << where;
          if (x.size(dim) == 0) continue;  // max/min/argmax of an empty dimension are errors on both
          EXPECT_TRUE(matches_cpu(max(g, dim, keepdim), max(x, dim, keepdim))) << "max " << where;
          EXPECT_TRUE(matches_cpu(min(g, dim, keepdim), min(x, dim, keepdim))) << "min " << where;
          EXPECT_TRUE(matches_cpu(argmax(g, dim, keepdim), argmax(x, dim, keepdim))) << "argmax " << where;
        }
      }
    }
  }
}

TEST(CudaReduce, ArgmaxTakesTheFirstOfTiesAndNaNWinsAsOnTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // 20000 columns so the row is split into parts and ties cross part boundaries.
  std::vector<float> values(2 * 20000, 1.0f);
  values[20000 + 15000] = nan;
  values[20000 + 17000] = nan;
  const Tensor x = Tensor::from_vector(values, {2, 20000});
  EXPECT_TRUE(matches_cpu(argmax(x.to(kGpu), 1), argmax(x, 1)));
  EXPECT_EQ(argmax(x.to(kGpu), 1).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 15000}));
  EXPECT_TRUE(std::isnan(max(x.to(kGpu)).item()));
  EXPECT_TRUE(matches_cpu(min(x.select(0).to(kGpu)), min(x.select(0))));
}

TEST(CudaReduce, EmptyTensorsReduceLikeTheCpu) {
  TROUPE_SKIP_WITHOUT_GPU();
  const Tensor x = Tensor::zeros({0}), g = x.to(kGpu);
  EXPECT_TRUE(matches_cpu(sum(g), sum(x)));
  EXPECT_TRUE(matches_cpu(mean(g), mean(x)));  // NaN on both
  EXPECT_THROW(max(g), InvalidArgument);
}
