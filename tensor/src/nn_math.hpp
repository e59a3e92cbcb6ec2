// Per-element formulas of the activation gradients, compiled for the host
// (nn_ops.cpp) and the device (cuda/cuda_nn.cu) from this one text, as optim_step.hpp
// is for the optimizers. They are the derivatives of elementwise.cpp's relu, gelu and
// tanh, in the element type's compute type.
#pragma once

#include <cmath>

#include "troupe/tensor/half.hpp"  // TROUPE_HOST_DEVICE

namespace troupe::tensor::detail {

enum class ActivationGrad { relu, gelu, gelu_tanh, tanh };

template <class C>
TROUPE_HOST_DEVICE inline C activation_grad(ActivationGrad op, C saved, C gy) {
#ifdef __CUDA_ARCH__
  using ::erf, ::exp, ::tanh;
#else
  using std::erf, std::exp, std::tanh;
#endif
  constexpr C kSqrt2OverPi = C(0.7978845608028654), kInvSqrt2 = C(0.7071067811865476),
              kInvSqrt2Pi = C(0.3989422804014327), kCubic = C(0.044715);
  const C x = saved;
  switch (op) {
    case ActivationGrad::relu: return x > C(0) ? gy : C(0);
    case ActivationGrad::gelu: {
      // d/dx [x Phi(x)] = Phi(x) + x phi(x).
      const C cdf = C(0.5) * (C(1) + erf(x * kInvSqrt2));
      const C pdf = kInvSqrt2Pi * exp(C(-0.5) * x * x);
      return gy * (cdf + x * pdf);
    }
    case ActivationGrad::gelu_tanh: {
      // d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) u', t = tanh(u), u = k (x + c x^3),
      // with 0.5 (1 + t) = s = sigmoid(2u) and 0.5 (1 - t^2) = 2 s (1 - s): one exp, no tanh.
      const C s = C(1) / (C(1) + exp(C(-2) * kSqrt2OverPi * (x + kCubic * x * x * x)));
      const C du = kSqrt2OverPi * (C(1) + C(3) * kCubic * x * x);
      return gy * (s + C(2) * x * s * (C(1) - s) * du);
    }
    case ActivationGrad::tanh:  // saved is the output y: d tanh = 1 - y^2
      return gy * (C(1) - x * x);
  }
  return C(0);
}

}  // namespace troupe::tensor::detail
