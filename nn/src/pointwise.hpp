// Drivers for the elementwise layers (activations, dropout): a plain loop over
// contiguous host memory in the element type's compute type, like llm.c's kernels.
// Private to nn/src.
#pragma once

#include <cstdint>

#include "troupe/error.hpp"
#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::nn::detail {

using tensor::Tensor;

// Checks that `x` can go through a host kernel: defined, floating, on the CPU.
inline void check_host_floating(const Tensor& x, const std::string& op) {
  TROUPE_CHECK(x.defined(), op, ": input is undefined");
  TROUPE_CHECK(tensor::is_floating(x.dtype()), op, ": needs a floating dtype, got ", x.dtype());
  TROUPE_CHECK(x.device().is_cpu(), op, ": runs on the CPU, input is on ", x.device());
}

// out[i] = f(x[i]), f taking and returning the compute type.
template <class F>
Tensor map(const Tensor& x, const std::string& op, F f) {
  check_host_floating(x, op);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  tensor::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using C = tensor::compute_t<T>;
    const T* in = x.data<T>();
    T* o = out.data<T>();
    for (std::int64_t i = 0; i < x.numel(); ++i) o[i] = T(f(static_cast<C>(in[i])));
  });
  return out;
}

// out[i] = f(a[i], b[i]) for two tensors of one shape and dtype (a backward's
// saved tensor and its incoming gradient).
template <class F>
Tensor map2(const Tensor& a, const Tensor& b, const std::string& op, F f) {
  check_host_floating(a, op);
  check_host_floating(b, op);
  TROUPE_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), op, ": expected ", a.dtype(), " ",
               tensor::to_string(a.shape()), " (the forward's shape), got ", b.dtype(), " ",
               tensor::to_string(b.shape()));
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  tensor::dispatch_floating(a.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using C = tensor::compute_t<T>;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* o = out.data<T>();
    for (std::int64_t i = 0; i < a.numel(); ++i) o[i] = T(f(static_cast<C>(pa[i]), static_cast<C>(pb[i])));
  });
  return out;
}

}  // namespace troupe::nn::detail
