// What tensor_parallel.cpp (the layers) and tensor_parallel_state.cpp (splitting and
// gathering state) share. Private to parallel/.
#pragma once

#include <cstdint>

#include "troupe/error.hpp"
#include "troupe/shard_range.hpp"
#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel::detail {

// The length of rank's shard_range of n.
inline std::int64_t length(std::int64_t n, int rank, int world) {
  const auto [begin, end] = shard_range(n, rank, world);
  return end - begin;
}

inline void require_host(const tensor::Tensor& t, const char* op) {
  TROUPE_CHECK(t.device().is_cpu(), op, ": tensor parallelism runs on host tensors for now, got one on ", t.device());
}

// f(i, value) for every element of a floating host tensor, as double.
template <class F>
void for_each_value(const tensor::Tensor& t, F&& f) {
  tensor::dispatch_floating(t.dtype(), "tensor parallelism", [&](auto tag) {
    using T = decltype(tag);
    const T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) f(i, static_cast<double>(static_cast<tensor::compute_t<T>>(p[i])));
  });
}

}  // namespace troupe::parallel::detail
