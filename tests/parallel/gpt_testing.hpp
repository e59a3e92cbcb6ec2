// What the tensor- and pipeline-parallel tests share: token ids (tests/nn's) and the
// distance between a gathered tensor and the one-rank reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "../nn/token_ids.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::train::testing {

using nn::testing::token_ids;

// ||a - b|| / ||b|| over the whole tensor, in double.
inline double norm_relative(const tensor::Tensor& a, const tensor::Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    ref += double(y[i]) * y[i];
  }
  return x.size() == y.size() ? std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30) : INFINITY;
}

}  // namespace troupe::train::testing
