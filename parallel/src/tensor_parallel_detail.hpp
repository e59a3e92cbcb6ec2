// What tensor_parallel.cpp (the layers), tensor_parallel_state.cpp (splitting and
// gathering state) and the pipeline's clipping share. Private to parallel/.
#pragma once

#include <cstdint>

#include "troupe/error.hpp"
#include "troupe/shard_range.hpp"
#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel::detail {

// The length of rank's shard_range of n.
inline std::int64_t length(std::int64_t n, int rank, int world) {
  const auto [begin, end] = shard_range(n, rank, world);
  return end - begin;
}

// The sum of a gradient's squares, in double: a loop in element order on the host, the
// norm's reduction (double accumulation too) on a GPU.
inline double sum_of_squares(const tensor::Tensor& g) {
  if (!g.device().is_cpu()) {
    const double norm = tensor::norm(g).item();
    return norm * norm;
  }
  double sum = 0;
  tensor::dispatch_floating(g.dtype(), "sum_of_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = g.data<T>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      const double v = static_cast<double>(static_cast<tensor::compute_t<T>>(p[i]));
      sum += v * v;
    }
  });
  return sum;
}

}  // namespace troupe::parallel::detail
