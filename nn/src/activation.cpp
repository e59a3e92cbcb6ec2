#include "troupe/nn/activation.hpp"

#include <cmath>

#include "pointwise.hpp"
#include "troupe/error.hpp"

namespace troupe::nn {

namespace {

void check_forward_ran(const Tensor& saved, const std::string& op) {
  TROUPE_CHECK(saved.defined(), op, ": called before forward");
}

constexpr double kSqrt2OverPi = 0.7978845608028654;   // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.7071067811865476;      // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;    // 1/sqrt(2 pi)
constexpr double kGeluCubic = 0.044715;

}  // namespace

Tensor ReLU::forward(const Tensor& input) {
  input_ = input;
  return detail::map(input, "ReLU.forward", [](auto x) { return x > 0 ? x : decltype(x)(0); });
}

Tensor ReLU::backward(const Tensor& grad_output) {
  check_forward_ran(input_, "ReLU.backward");
  return detail::map2(input_, grad_output, "ReLU.backward",
                      [](auto x, auto gy) { return x > 0 ? gy : decltype(x)(0); });
}

GELU::GELU(std::string_view approximate) {
  if (approximate == "none") approximate_ = GeluApproximate::none;
  else if (approximate == "tanh") approximate_ = GeluApproximate::tanh;
  else TROUPE_THROW(InvalidArgument, "GELU: approximate must be 'none' or 'tanh', got '", approximate, "'");
}

std::string GELU::type_name() const {
  return approximate_ == GeluApproximate::tanh ? "GELU(approximate='tanh')" : "GELU";
}

Tensor GELU::forward(const Tensor& input) {
  input_ = input;
  if (approximate_ == GeluApproximate::tanh) {
    return detail::map(input, "GELU.forward", [](auto x) {
      using C = decltype(x);
      const C inner = C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
      return C(0.5) * x * (C(1) + std::tanh(inner));
    });
  }
  return detail::map(input, "GELU.forward", [](auto x) {
    using C = decltype(x);
    return C(0.5) * x * (C(1) + std::erf(x * C(kInvSqrt2)));
  });
}

Tensor GELU::backward(const Tensor& grad_output) {
  check_forward_ran(input_, "GELU.backward");
  if (approximate_ == GeluApproximate::tanh) {
    // d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3c x^2), t = tanh(k (x + c x^3)).
    return detail::map2(input_, grad_output, "GELU.backward", [](auto x, auto gy) {
      using C = decltype(x);
      const C k = C(kSqrt2OverPi), c = C(kGeluCubic);
      const C t = std::tanh(k * (x + c * x * x * x));
      const C dt = k * (C(1) + C(3) * c * x * x);
      return gy * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * dt);
    });
  }
  // d/dx [x Phi(x)] = Phi(x) + x phi(x).
  return detail::map2(input_, grad_output, "GELU.backward", [](auto x, auto gy) {
    using C = decltype(x);
    const C cdf = C(0.5) * (C(1) + std::erf(x * C(kInvSqrt2)));
    const C pdf = C(kInvSqrt2Pi) * std::exp(C(-0.5) * x * x);
    return gy * (cdf + x * pdf);
  });
}

Tensor Tanh::forward(const Tensor& input) {
  output_ = detail::map(input, "Tanh.forward", [](auto x) { return std::tanh(x); });
  return output_;
}

Tensor Tanh::backward(const Tensor& grad_output) {
  check_forward_ran(output_, "Tanh.backward");
  return detail::map2(output_, grad_output, "Tanh.backward",
                      [](auto y, auto gy) { return gy * (decltype(y)(1) - y * y); });
}

}  // namespace troupe::nn
