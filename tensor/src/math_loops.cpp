// detail::math_loops: the host's hot f32 loops, compiled three times (math_loops.hpp).
//
// exp_f32 is Cephes' expf: x = n ln2 + r with |r| <= ln2/2, a degree-6 polynomial
// for e^r, and 2^n put straight into the exponent bits. It is written without
// branches (the clamps are selects) so that GCC vectorises the loops that call it;
// this file is compiled with -fno-trapping-math, without which GCC keeps the selects
// as branches. 2^n is applied as two factors, 2^(n/2) 2^(n - n/2), so that both stay
// normal floats from the smallest subnormal result to FLT_MAX and the last multiply
// rounds the result once, as libm's does.
//
// Sums over a row are lane_sum's eight partial sums in a fixed order, the same on
// every copy of the loops.
#include "math_loops.hpp"

#include "avx512_target.hpp"
#include "lane_sum.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace troupe::tensor::detail {

namespace {

inline float exp_f32(float x) {
  constexpr float kHi = 88.72283905206835f;  // ln(FLT_MAX): above it, +inf
  constexpr float kLo = -103.97208f;         // ln of the smallest subnormal / 2: below it, 0
  const float xc = x > kHi ? kHi : (x < kLo ? kLo : x);
  // n = round(x / ln2) by the 1.5 * 2^23 trick, which also leaves n in t's low bits.
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const std::int32_t k = std::bit_cast<std::int32_t>(t) - 0x4B400000;
  float r = xc - n * 0.693359375f;  // ln2 in two parts, the first exact in n * it
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t k1 = k >> 1, k2 = k - k1;
  const float y = p * std::bit_cast<float>((k1 + 127) << 23) * std::bit_cast<float>((k2 + 127) << 23);
  return x > kHi ? std::numeric_limits<float>::infinity() : (x < kLo ? 0.0f : y);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;

inline void gelu_tanh_loop(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kCubic * xi * xi * xi);
    y[i] = xi / (1.0f + exp_f32(-2.0f * u));
  }
}

// nn_math.hpp's gelu_tanh gradient, with exp_f32.
inline void gelu_tanh_backward_loop(const float* x, const float* gy, float* gx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float s = 1.0f / (1.0f + exp_f32(-2.0f * kSqrt2OverPi * (xi + kCubic * xi * xi * xi)));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * xi * xi);
    gx[i] = gy[i] * (s + 2.0f * xi * s * (1.0f - s) * du);
  }
}

inline float row_sum(const float* s, std::int64_t n) {
  return lane_sum<float>(n, [s](std::int64_t j) { return s[j]; });
}

inline float row_dot(const float* a, const float* b, std::int64_t n) {
  return lane_sum<float>(n, [a, b](std::int64_t j) { return a[j] * b[j]; });
}

// The largest element; a NaN never wins here, but then turns the whole row to NaN
// through exp, as it does in PyTorch.
inline float row_max(const float* s, std::int64_t n) {
  constexpr int kLanes = 8;
  float acc[kLanes];
  for (float& a : acc) a = -std::numeric_limits<float>::infinity();
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = s[j + l] > acc[l] ? s[j + l] : acc[l];
  for (int l = 0; j < n; ++j, ++l) acc[l] = s[j] > acc[l] ? s[j] : acc[l];
  float m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

inline void exp_shifted_loop(float* s, std::int64_t n, float shift) {
  for (std::int64_t j = 0; j < n; ++j) s[j] = exp_f32(s[j] - shift);
}

inline float softmax_row_loop(float* s, std::int64_t n) {
  const float m = row_max(s, n);
  exp_shifted_loop(s, n, m);
  const float sum = row_sum(s, n);
  const float inv = 1.0f / sum;
  for (std::int64_t j = 0; j < n; ++j) s[j] *= inv;
  return m + std::log(sum);
}

inline void softmax_backward_row_loop(const float* p, float* dp, std::int64_t n) {
  const float dot = row_dot(p, dp, n);
  for (std::int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - dot);
}

// Summed in double: a row of GPT-2's 50257 classes in eight float lanes could lose
// 1e-4 of the sum; exp_f32 is the cost, the widening add is not.
inline double log_sum_exp_row_loop(const float* x, std::int64_t n, double* sum) {
  const float m = row_max(x, n);
  const double s = lane_sum<double>(n, [x, m](std::int64_t j) { return static_cast<double>(exp_f32(x[j] - m)); });
  if (sum) *sum = lane_sum<double>(n, [x](std::int64_t j) { return static_cast<double>(x[j]); });
  return static_cast<double>(m) + std::log(s);
}

inline void cross_entropy_grad_row_loop(const float* x, std::int64_t n, std::int64_t target, float lse, float on,
                                        float off, float factor, float* g) {
  for (std::int64_t j = 0; j < n; ++j) g[j] = (exp_f32(x[j] - lse) - off) * factor;
  g[target] = (exp_f32(x[target] - lse) - (on + off)) * factor;
}

[[gnu::always_inline]] inline void adam_loop(float* p, const float* g, float* m, float* v, std::int64_t n,
                                             const AdamScalars& s) {
  for (std::int64_t i = 0; i < n; ++i) adam_element(p[i], g[i], m[i], v[i], s);
}

// One copy: the loops above and row_loops.hpp's, inlined into functions compiled for
// one instruction set. A macro, since a target attribute cannot be a template argument.
#define TROUPE_HOST_LOOPS(ATTRIBUTE, SUFFIX)                                                                         \
  ATTRIBUTE void gelu_tanh_##SUFFIX(const float* x, float* y, std::int64_t n) { gelu_tanh_loop(x, y, n); }           \
  ATTRIBUTE void gelu_tanh_backward_##SUFFIX(const float* x, const float* gy, float* gx, std::int64_t n) {           \
    gelu_tanh_backward_loop(x, gy, gx, n);                                                                           \
  }                                                                                                                  \
  ATTRIBUTE float softmax_row_##SUFFIX(float* s, std::int64_t n) { return softmax_row_loop(s, n); }                  \
  ATTRIBUTE void exp_shifted_##SUFFIX(float* s, std::int64_t n, float shift) { exp_shifted_loop(s, n, shift); }      \
  ATTRIBUTE void softmax_backward_row_##SUFFIX(const float* p, float* dp, std::int64_t n) {                          \
    softmax_backward_row_loop(p, dp, n);                                                                             \
  }                                                                                                                  \
  ATTRIBUTE double log_sum_exp_row_##SUFFIX(const float* x, std::int64_t n, double* sum) {                           \
    return log_sum_exp_row_loop(x, n, sum);                                                                          \
  }                                                                                                                  \
  ATTRIBUTE void cross_entropy_grad_row_##SUFFIX(const float* x, std::int64_t n, std::int64_t target, float lse,     \
                                                 float on, float off, float factor, float* g) {                      \
    cross_entropy_grad_row_loop(x, n, target, lse, on, off, factor, g);                                              \
  }                                                                                                                  \
  ATTRIBUTE void sum_rows_##SUFFIX(const float* in, std::int64_t rows, std::int64_t inner, bool mean, double* acc,   \
                                   float* out) {                                                                     \
    sum_rows_loop(in, rows, inner, mean, acc, out);                                                                  \
  }                                                                                                                  \
  ATTRIBUTE void layer_norm_forward_##SUFFIX(const float* x, const float* w, const float* b, std::int64_t rows,      \
                                             std::int64_t n, double eps, float* y, double* means, double* rstds) {   \
    layer_norm_forward_rows(x, w, b, rows, n, eps, y, means, rstds);                                                 \
  }                                                                                                                  \
  ATTRIBUTE void layer_norm_backward_##SUFFIX(const float* x, const float* gy, const float* w, const double* means,  \
                                              const double* rstds, std::int64_t rows, std::int64_t n, float* gx,     \
                                              const LayerNormGrads& grads) {                                         \
    layer_norm_backward_rows(x, gy, w, means, rstds, rows, n, gx, grads);                                            \
  }                                                                                                                  \
  ATTRIBUTE void adam_##SUFFIX(float* p, const float* g, float* m, float* v, std::int64_t n, const AdamScalars& s) { \
    adam_loop(p, g, m, v, n, s);                                                                                     \
  }                                                                                                                  \
  constexpr MathLoops k_##SUFFIX = {gelu_tanh_##SUFFIX,                                                              \
                                    gelu_tanh_backward_##SUFFIX,                                                     \
                                    softmax_row_##SUFFIX,                                                            \
                                    exp_shifted_##SUFFIX,                                                            \
                                    softmax_backward_row_##SUFFIX,                                                   \
                                    log_sum_exp_row_##SUFFIX,                                                        \
                                    cross_entropy_grad_row_##SUFFIX,                                                 \
                                    sum_rows_##SUFFIX,                                                               \
                                    layer_norm_forward_##SUFFIX,                                                     \
                                    layer_norm_backward_##SUFFIX,                                                    \
                                    adam_##SUFFIX};

TROUPE_HOST_LOOPS(, baseline)

#if defined(__x86_64__) && defined(__GNUC__)
TROUPE_HOST_LOOPS([[gnu::target("avx2")]], avx2)
// 512-bit vectors: twice the lanes per instruction where the core has full-width
// AVX-512 units (Zen 5, Intel's server cores).
TROUPE_HOST_LOOPS(TROUPE_AVX512_TARGET, avx512)
constexpr const MathLoops* kAvx2 = &k_avx2;
constexpr const MathLoops* kAvx512 = &k_avx512;
#else
constexpr const MathLoops* kAvx2 = nullptr;
constexpr const MathLoops* kAvx512 = nullptr;
#endif
#undef TROUPE_HOST_LOOPS

}  // namespace

const MathLoops* math_loops(HostLoops which) { return pick_loops(which, &k_baseline, kAvx2, kAvx512); }

float exp_f32_reference(float x) { return exp_f32(x); }

}  // namespace troupe::tensor::detail
