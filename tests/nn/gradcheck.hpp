// Central finite differences in f64, to check an explicit backward.
//
// For a module, the scalar checked is L = sum(forward(x) * R) with a fixed random
// R, so backward(R) must return dL/dx and leave dL/dparam in each grad. Each input
// and parameter element is nudged by +-eps and L recomputed: with eps = 1e-6 the
// truncation error is ~eps^2 and the rounding error ~1e-16/eps, both far below the
// tolerance of 1e-7 + 1e-6 |numeric|.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "troupe/nn/module.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::nn::gradcheck {

struct GradCheck {
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-6;
  // Runs before every forward, e.g. to rewind Dropout's generator to one mask.
  std::function<void()> before_forward;
};

inline double dot(const Tensor& a, const Tensor& b) { return tensor::sum(tensor::mul(a, b)).item(); }

// d f / d v[i] at the current values, restoring v[i] afterwards.
inline double central_difference(double* v, double eps, const std::function<double()>& f) {
  const double saved = *v;
  *v = saved + eps;
  const double plus = f();
  *v = saved - eps;
  const double minus = f();
  *v = saved;
  return (plus - minus) / (2 * eps);
}

inline void expect_close(const Tensor& analytic, const std::function<double(std::int64_t)>& numeric,
                         const GradCheck& opt, const std::string& what) {
  ASSERT_TRUE(analytic.defined()) << what << ": gradient is undefined";
  ASSERT_EQ(analytic.dtype(), tensor::DType::f64) << what;
  const double* a = analytic.data<double>();
  for (std::int64_t i = 0; i < analytic.numel(); ++i) {
    const double n = numeric(i);
    EXPECT_NEAR(a[i], n, opt.atol + opt.rtol * std::abs(n)) << what << " element " << i;
  }
}

// Checks module.backward against finite differences for the input (when it is
// floating) and for every parameter.
inline void expect_module_gradients(Module& module, const Tensor& input, const GradCheck& opt = {}) {
  const auto run = [&] {
    if (opt.before_forward) opt.before_forward();
    return module.forward(input);
  };
  const Tensor y = run();
  tensor::Generator gen(1234);
  const Tensor r = tensor::normal(y.shape(), 0, 1, gen, tensor::DType::f64);
  module.zero_grad();
  const Tensor grad_input = module.backward(r);
  const auto loss = [&] { return dot(run(), r); };

  if (tensor::is_floating(input.dtype())) {
    double* x = input.data<double>();
    expect_close(
        grad_input, [&](std::int64_t i) { return central_difference(x + i, opt.eps, loss); }, opt,
        module.type_name() + " input");
  }
  for (auto& [name, param] : module.named_parameters()) {
    double* p = param->data.data<double>();
    expect_close(
        param->grad, [&](std::int64_t i) { return central_difference(p + i, opt.eps, loss); }, opt,
        module.type_name() + " parameter '" + name + "'");
  }
}

// Checks an analytic gradient of a scalar function of x against finite differences.
inline void expect_gradient(const std::function<double()>& f, const Tensor& x, const Tensor& analytic,
                            const std::string& what, const GradCheck& opt = {}) {
  double* v = x.data<double>();
  expect_close(
      analytic, [&](std::int64_t i) { return central_difference(v + i, opt.eps, f); }, opt, what);
}

}  // namespace troupe::nn::gradcheck
