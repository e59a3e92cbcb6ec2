// The vectorised f32 loops behind GELU, attention's softmax and the cross-entropy
// (tensor/src/math_loops.hpp): exp_f32's accuracy, each compiled copy against
// double-precision formulas, and every copy this CPU can run giving the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../../tensor/src/math_loops.hpp"

using namespace troupe::tensor;
using troupe::tensor::detail::HostLoops;
using troupe::tensor::detail::MathLoops;

namespace {

std::vector<const MathLoops*> copies_on_this_cpu() {
  std::vector<const MathLoops*> found;
  for (const HostLoops which : {HostLoops::baseline, HostLoops::avx2, HostLoops::avx512, HostLoops::best})
    if (const MathLoops* loops = troupe::tensor::detail::math_loops(which)) found.push_back(loops);
  return found;
}

std::vector<float> random_floats(std::size_t n, float spread, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double ulps(float got, double exact) {
  const auto e = static_cast<float>(exact);
  const double ulp = std::nextafter(std::fabs(e), std::numeric_limits<float>::infinity()) - std::fabs(e);
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}

double gelu_tanh_exact(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

double gelu_tanh_grad_exact(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

}  // namespace

TEST(MathLoops, ExpIsWithinOneUlpAndSaturatesCleanly) {
  double worst = 0;
  float worst_at = 0;
  // 1.8 million points from the smallest normal result to FLT_MAX's logarithm, and
  // arguments near 0 down to 1e-30.
  std::vector<float> xs;
  for (int i = 0; i <= 1760000; ++i) xs.push_back(-87.3f + static_cast<float>(i) * 1e-4f);
  for (float x = 1e-30f; x < 1.0f; x *= 1.01f) xs.insert(xs.end(), {x, -x});
  for (const float x : xs) {
    const double e = ulps(troupe::tensor::detail::exp_f32_reference(x), std::exp(static_cast<double>(x)));
    if (e > worst) worst = e, worst_at = x;
  }
  EXPECT_LE(worst, 1.0) << "at x = " << worst_at;
  // Subnormal results stay close in absolute terms; far below, exactly 0; above, +inf.
  EXPECT_NEAR(troupe::tensor::detail::exp_f32_reference(-95.0f), std::exp(-95.0), 1e-45);
  EXPECT_EQ(troupe::tensor::detail::exp_f32_reference(-200.0f), 0.0f);
  EXPECT_EQ(troupe::tensor::detail::exp_f32_reference(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(troupe::tensor::detail::exp_f32_reference(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(troupe::tensor::detail::exp_f32_reference(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isnan(troupe::tensor::detail::exp_f32_reference(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(troupe::tensor::detail::exp_f32_reference(0.0f), 1.0f);
}

TEST(MathLoops, GeluAndItsGradientFollowTheTanhFormula) {
  std::vector<float> x = random_floats(4099, 3.0f, 1);
  x.insert(x.end(), {0.0f, -0.0f, 20.0f, -20.0f, 1e-30f, -1e-30f});
  const std::vector<float> gy = random_floats(x.size(), 1.0f, 2);
  const auto n = static_cast<std::int64_t>(x.size());
  for (const MathLoops* loops : copies_on_this_cpu()) {
    std::vector<float> y(x.size()), gx(x.size());
    loops->gelu_tanh(x.data(), y.data(), n);
    loops->gelu_tanh_backward(x.data(), gy.data(), gx.data(), n);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double want = gelu_tanh_exact(x[i]);
      EXPECT_NEAR(y[i], want, 2e-6 * std::max(1.0, std::fabs(want))) << "gelu at x = " << x[i];
      const double want_grad = gy[i] * gelu_tanh_grad_exact(x[i]);
      EXPECT_NEAR(gx[i], want_grad, 2e-6 * std::max(1.0, std::fabs(want_grad))) << "gradient at x = " << x[i];
    }
  }
}

TEST(MathLoops, SoftmaxRowsMatchDoublePrecision) {
  for (const MathLoops* loops : copies_on_this_cpu()) {
    for (const std::int64_t n : {1, 7, 8, 9, 64, 250}) {
      const std::vector<float> s = random_floats(static_cast<std::size_t>(n), 4.0f, static_cast<unsigned>(n));
      std::vector<float> p = s;
      const float lse = loops->softmax_row(p.data(), n);
      double m = s[0], sum = 0;
      for (float v : s) m = std::max(m, static_cast<double>(v));
      for (float v : s) sum += std::exp(v - m);
      EXPECT_NEAR(lse, m + std::log(sum), 2e-6 * std::max(1.0, std::fabs(m))) << "n = " << n;
      for (std::int64_t j = 0; j < n; ++j)
        EXPECT_NEAR(p[static_cast<std::size_t>(j)], std::exp(s[static_cast<std::size_t>(j)] - m) / sum, 1e-6)
            << "n = " << n << ", j = " << j;
      // The row again from its log-sum-exp, and the Jacobian applied to a gradient row.
      std::vector<float> again = s;
      loops->exp_shifted(again.data(), n, lse);
      for (std::int64_t j = 0; j < n; ++j)
        EXPECT_NEAR(again[static_cast<std::size_t>(j)], p[static_cast<std::size_t>(j)], 1e-6);
      std::vector<float> dp = random_floats(static_cast<std::size_t>(n), 1.0f, 7);
      const std::vector<float> dp_in = dp;
      loops->softmax_backward_row(p.data(), dp.data(), n);
      double dot = 0;
      for (std::int64_t j = 0; j < n; ++j)
        dot += static_cast<double>(p[static_cast<std::size_t>(j)]) * dp_in[static_cast<std::size_t>(j)];
      for (std::int64_t j = 0; j < n; ++j) {
        const auto k = static_cast<std::size_t>(j);
        EXPECT_NEAR(dp[k], p[k] * (dp_in[k] - dot), 1e-6) << "n = " << n << ", j = " << j;
      }
    }
  }
}

// The cross-entropy's rows, up to GPT-2's vocabulary: log-sum-exp and the gradient row
// against the same formulas in double.
TEST(MathLoops, CrossEntropyRowsMatchDoublePrecision) {
  for (const MathLoops* loops : copies_on_this_cpu()) {
    for (const std::int64_t n : {1, 7, 89, 1037, 50257}) {
      const std::vector<float> x = random_floats(static_cast<std::size_t>(n), 3.0f, static_cast<unsigned>(n));
      double sum = 0;
      const double lse = loops->log_sum_exp_row(x.data(), n, &sum);
      double m = x[0], exact_sum = 0, sum_exp = 0;
      for (float v : x) m = std::max(m, static_cast<double>(v)), exact_sum += v;
      for (float v : x) sum_exp += std::exp(v - m);
      const double exact_lse = m + std::log(sum_exp);
      EXPECT_NEAR(lse, exact_lse, 1e-6 * std::max(1.0, std::fabs(exact_lse))) << "n = " << n;
      EXPECT_NEAR(sum, exact_sum, 1e-9 * static_cast<double>(n)) << "n = " << n;
      EXPECT_EQ(loops->log_sum_exp_row(x.data(), n, nullptr), lse);
      const std::int64_t target = n / 3;
      const double eps = 0.1, factor = 0.25, off = eps / static_cast<double>(n);
      std::vector<float> g(x.size());
      loops->cross_entropy_grad_row(x.data(), n, target, static_cast<float>(lse), static_cast<float>(1 - eps),
                                    static_cast<float>(off), static_cast<float>(factor), g.data());
      for (std::int64_t j = 0; j < n; ++j) {
        const auto k = static_cast<std::size_t>(j);
        const double want = (std::exp(x[k] - exact_lse) - (j == target ? 1 - eps : 0.0) - off) * factor;
        ASSERT_NEAR(g[k], want, 1e-6 * std::max(1e-3, std::fabs(want))) << "n = " << n << ", j = " << j;
      }
    }
  }
}

// A machine without AVX2 must train to the bits of one with it.
TEST(MathLoops, EveryCompiledCopyGivesTheSameBits) {
  const std::vector<const MathLoops*> copies = copies_on_this_cpu();
  ASSERT_GE(copies.size(), 2u);  // the baseline and best at least
  const std::vector<float> x = random_floats(1037, 3.0f, 3), g = random_floats(1037, 1.0f, 4);
  const auto bits = [](const std::vector<float>& v) {
    std::vector<std::uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    return b;
  };
  const auto run = [&](const MathLoops* loops) {
    std::vector<float> y(x.size()), gx(x.size()), row(x.begin(), x.begin() + 203), back = g;
    loops->gelu_tanh(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
    loops->gelu_tanh_backward(x.data(), g.data(), gx.data(), static_cast<std::int64_t>(x.size()));
    const float lse = loops->softmax_row(row.data(), 203);
    loops->softmax_backward_row(row.data(), back.data(), 203);
    double logit_sum = 0;
    const double ce_lse = loops->log_sum_exp_row(x.data(), 1037, &logit_sum);
    std::vector<float> ce_grad(x.size());
    loops->cross_entropy_grad_row(x.data(), 1037, 5, static_cast<float>(ce_lse), 0.9f, 1e-4f, 0.5f, ce_grad.data());
    y.insert(y.end(), ce_grad.begin(), ce_grad.end());
    y.insert(y.end(), {static_cast<float>(ce_lse), static_cast<float>(ce_lse - static_cast<float>(ce_lse)),
                       static_cast<float>(logit_sum)});
    y.insert(y.end(), gx.begin(), gx.end());
    y.insert(y.end(), row.begin(), row.end());
    y.insert(y.end(), back.begin(), back.begin() + 203);
    y.push_back(lse);
    return bits(y);
  };
  const auto first = run(copies.front());
  for (const MathLoops* loops : copies) EXPECT_EQ(run(loops), first);
}

// The row loops and the Adam step, which sum in double and use sqrt and division: the
// same bits in every copy, on rows whose length is not a multiple of any vector width.
TEST(MathLoops, EveryCompiledCopyOfTheRowLoopsAndAdamGivesTheSameBits) {
  const std::vector<const MathLoops*> copies = copies_on_this_cpu();
  ASSERT_GE(copies.size(), 2u);
  constexpr std::int64_t kRows = 37, kN = 389;
  const auto size = static_cast<std::size_t>(kRows * kN);
  const std::vector<float> x = random_floats(size, 2.0f, 5), gy = random_floats(size, 1.0f, 6);
  const std::vector<float> w = random_floats(kN, 1.0f, 7), b = random_floats(kN, 1.0f, 8);
  const auto run = [&](const MathLoops* loops) {
    std::vector<double> doubles(kN), means(kRows), rstds(kRows), dweight(kN), dbias(kN), xhat(kN), dnorm(kN);
    std::vector<float> sums(kN), y(size), gx(size);
    loops->sum_rows(gy.data(), kRows, kN, false, doubles.data(), sums.data());
    loops->layer_norm_forward(x.data(), w.data(), b.data(), kRows, kN, 1e-5, y.data(), means.data(), rstds.data());
    loops->layer_norm_backward(x.data(), gy.data(), w.data(), means.data(), rstds.data(), kRows, kN, gx.data(),
                               {dweight.data(), dbias.data(), xhat.data(), dnorm.data()});
    // Two AdamW steps from zero moments, so that both moments feed the second.
    std::vector<float> p = x, m(size), v(size);
    for (const std::int64_t step : {1, 2}) {
      const troupe::tensor::detail::AdamScalars s{0.9f,
                                                  0.95f,
                                                  0.1f,
                                                  0.05f,
                                                  1e-8f,
                                                  0.1f,
                                                  1.0f - 6e-5f,
                                                  static_cast<float>(6e-4 / (1 - std::pow(0.9, step))),
                                                  static_cast<float>(std::sqrt(1 - std::pow(0.95, step))),
                                                  true};
      loops->adam(p.data(), gy.data(), m.data(), v.data(), static_cast<std::int64_t>(size), s);
    }
    std::vector<std::uint64_t> out;
    const auto add = [&out](const auto& values) {
      for (const auto value : values) {
        std::uint64_t word = 0;
        std::memcpy(&word, &value, sizeof value);
        out.push_back(word);
      }
    };
    for (const auto* values : {&sums, &y, &gx, &p, &m, &v}) add(*values);
    for (const auto* values : {&means, &rstds, &dweight, &dbias}) add(*values);
    return out;
  };
  const auto first = run(copies.front());
  for (const MathLoops* loops : copies) EXPECT_EQ(run(loops), first);
}
