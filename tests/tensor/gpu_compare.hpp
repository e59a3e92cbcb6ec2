// Helpers for the tests that run an op on the GPU and on the CPU and compare: the
// skip without a device, and the tolerance per dtype (f32/f64: relative 1e-5, bf16:
// 1e-2, f16: 1e-3; integers and u8 exactly).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "troupe/tensor/ops.hpp"

namespace troupe::tensor::testing {

inline const char* no_gpu_reason() { return cuda_built() ? "no CUDA device on this machine" : "built without CUDA"; }

#define TROUPE_SKIP_WITHOUT_GPU() \
  if (!::troupe::tensor::cuda_available()) GTEST_SKIP() << ::troupe::tensor::testing::no_gpu_reason()

inline double tolerance(DType t) {
  switch (t) {
    case DType::bf16: return 1e-2;
    case DType::f16: return 1e-3;
    case DType::f32:
    case DType::f64: return 1e-5;
    default: return 0;
  }
}

// gpu (any device) equals cpu in dtype and shape, and in value within tolerance(dtype);
// NaN matches NaN.
inline ::testing::AssertionResult matches_cpu(const Tensor& gpu, const Tensor& cpu) {
  const Tensor g = gpu.to(Device::cpu());
  if (g.dtype() != cpu.dtype() || g.shape() != cpu.shape())
    return ::testing::AssertionFailure() << "GPU result is " << g.dtype() << " " << to_string(g.shape())
                                         << ", CPU result " << cpu.dtype() << " " << to_string(cpu.shape());
  const double tol = tolerance(cpu.dtype());
  const auto x = g.to_vector<double>(), y = cpu.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))) continue;
    // Relative error, with an absolute floor of tol for results near zero.
    if (std::fabs(x[i] - y[i]) <= tol * std::max(1.0, std::fabs(y[i])) && tol > 0) continue;
    return ::testing::AssertionFailure() << "element " << i << ": GPU " << x[i] << ", CPU " << y[i] << " ("
                                         << cpu.dtype() << ", tolerance " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace troupe::tensor::testing
