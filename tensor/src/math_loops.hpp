// The host's hot f32 loops, compiled for several instruction sets: GELU (tanh form)
// and its gradient, the rows of causal attention's softmax and of the cross-entropy
// loss, LayerNorm forward and backward, sums over rows (bias gradients), and the
// Adam/AdamW step. libm's expf is a call per element that stops the vectoriser; these
// loops use exp_f32 (math_loops.cpp), a branch-free polynomial within 1 ulp. Each is
// compiled for the baseline (SSE2), for AVX2 and for AVX-512 (x86-64-v4), picked once
// per process as cast_host's loops are. Every copy returns the same bits: the file is
// compiled without fused multiply-adds, and sums are kept in eight partial sums in a
// fixed order, not left to the vectoriser, so a machine without AVX-512 or AVX2 trains
// to the same result.
#pragma once

#include <cstdint>

#include "convert.hpp"  // HostLoops
#include "optim_step.hpp"
#include "row_loops.hpp"

namespace troupe::tensor::detail {

struct MathLoops {
  // y = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 x (1 + tanh u).
  void (*gelu_tanh)(const float* x, float* y, std::int64_t n);
  // gx = gy * d/dx gelu_tanh(x).
  void (*gelu_tanh_backward)(const float* x, const float* gy, float* gx, std::int64_t n);
  // s[0..n) = softmax(s[0..n)) in place; returns the row's log-sum-exp.
  float (*softmax_row)(float* s, std::int64_t n);
  // s[j] = exp(s[j] - shift): a softmax row again from its saved log-sum-exp.
  void (*exp_shifted)(float* s, std::int64_t n, float shift);
  // dp[j] = p[j] (dp[j] - sum_k p[k] dp[k]): the softmax's Jacobian applied to a row.
  void (*softmax_backward_row)(const float* p, float* dp, std::int64_t n);
  // log sum_j exp(x[j]), summed in double, and in *sum (when given) sum_j x[j]: a row of
  // the cross-entropy's forward (the second for label smoothing).
  double (*log_sum_exp_row)(const float* x, std::int64_t n, double* sum);
  // g[j] = (exp(x[j] - lse) - off - (j == target ? on : 0)) * factor: a row of the
  // cross-entropy's gradient, with the smoothed target's weights on and off.
  void (*cross_entropy_grad_row)(const float* x, std::int64_t n, std::int64_t target, float lse, float on, float off,
                                 float factor, float* g);
  // row_loops.hpp's sum_rows_loop, layer_norm_forward_rows and layer_norm_backward_rows.
  void (*sum_rows)(const float* in, std::int64_t rows, std::int64_t inner, bool mean, double* acc, float* out);
  void (*layer_norm_forward)(const float* x, const float* w, const float* b, std::int64_t rows, std::int64_t n,
                             double eps, float* y, double* means, double* rstds);
  void (*layer_norm_backward)(const float* x, const float* gy, const float* w, const double* means, const double* rstds,
                              std::int64_t rows, std::int64_t n, float* gx, const LayerNormGrads& grads);
  // optim_step.hpp's adam_element over n elements.
  void (*adam)(float* p, const float* g, float* m, float* v, std::int64_t n, const AdamScalars& s);
};

// The loops `which` names, or null where the CPU lacks them.
const MathLoops* math_loops(HostLoops which = HostLoops::best);

// exp(x) in f32 (what the loops use), for tests: within 1 ulp of the exact value;
// 0 below the smallest normal result, +inf above FLT_MAX, NaN for NaN.
float exp_f32_reference(float x);

}  // namespace troupe::tensor::detail
