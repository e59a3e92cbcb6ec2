// The per-element arithmetic of the fused optimizer steps, compiled for the host
// (fused_optim.cpp) and the device (cuda/cuda_optim.cu) from this one text, so the two
// cannot drift apart. The formulas are nn's SGD and Adam/AdamW (PyTorch's
// single-tensor forms) in f32; the scalars are computed once per call in double and
// rounded, as nn does.
#pragma once

#include <cmath>

#include "troupe/tensor/half.hpp"  // TROUPE_HOST_DEVICE

namespace troupe::tensor::detail {

// CUDA's device math is the global float overloads; the host's is std::.
TROUPE_HOST_DEVICE inline float sqrt_f32(float x) {
#ifdef __CUDA_ARCH__
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
TROUPE_HOST_DEVICE inline bool is_finite_f32(float x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

struct SgdScalars {
  float lr, weight_decay, momentum, one_minus_dampening;
  bool nesterov, first_step;  // first_step: the momentum buffer starts as the gradient
};

struct AdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float decay;      // AdamW: 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^t)
  float bias_correction2_sqrt;
  bool decoupled;
};

// buffer is null without momentum.
TROUPE_HOST_DEVICE inline void sgd_element(float& param, float grad, float* buffer, const SgdScalars& s) {
  float d = grad;
  if (s.weight_decay != 0) d = d + s.weight_decay * param;
  if (buffer != nullptr) {
    const float b = s.first_step ? d : s.momentum * *buffer + s.one_minus_dampening * d;
    *buffer = b;
    d = s.nesterov ? d + s.momentum * b : b;
  }
  param = param - s.lr * d;
}

TROUPE_HOST_DEVICE inline void adam_element(float& param, float grad, float& exp_avg, float& exp_avg_sq,
                                            const AdamScalars& s) {
  float p = param, g = grad;
  if (s.decoupled)
    p = p * s.decay;
  else if (s.weight_decay != 0)
    g = g + s.weight_decay * p;
  const float m = s.beta1 * exp_avg + s.one_minus_beta1 * g;
  const float v = s.beta2 * exp_avg_sq + s.one_minus_beta2 * g * g;
  exp_avg = m;
  exp_avg_sq = v;
  const float denom = sqrt_f32(v) / s.bias_correction2_sqrt + s.eps;
  param = p - s.step_size * m / denom;
}

// grad *= inv_scale, raising found_inf (never lowering it) for Inf or NaN.
TROUPE_HOST_DEVICE inline void unscale_element(float& grad, float inv_scale, float& found_inf) {
  if (!is_finite_f32(grad)) found_inf = 1.0f;
  grad = grad * inv_scale;
}

}  // namespace troupe::tensor::detail
