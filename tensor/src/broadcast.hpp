// NumPy/PyTorch broadcasting for binary elementwise kernels on the host.
//
// Shapes are aligned at their last dimension; a dimension of size 1 (or a missing
// one) is stretched to the other's size. The plan picks a plain loop for the cases
// training hits all the time (equal shapes, a scalar, a bias row added to every row
// of a batch) and an odometer walk over the output for everything else.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor::detail {

struct BroadcastPlan {
  enum class Kind { same, scalar_b, scalar_a, row_b, general };
  Kind kind = Kind::same;
  Shape out_shape;
  std::int64_t row = 0;                            // row_b: length of b, which repeats along out
  std::vector<std::int64_t> a_strides, b_strides;  // general: per output dim, 0 if stretched
};

// Contiguous strides of `shape` right-aligned to the output's dims, 0 where stretched.
std::vector<std::int64_t> broadcast_strides(const Shape& shape, const Shape& out);

// Checks dtype, device and shape compatibility; `op` names the operation in errors.
BroadcastPlan plan_broadcast(const Tensor& a, const Tensor& b, const char* op);

// out[i] = f(a[.], b[.]) following the plan. `out` may alias `a` when a has the
// output's shape (the in-place forms), because every kind reads a at index i.
template <class TA, class TO, class F>
void apply_binary(const BroadcastPlan& plan, const TA* a, const TA* b, TO* out, F f) {
  const std::int64_t n = shape_numel(plan.out_shape);
  using Kind = BroadcastPlan::Kind;
  switch (plan.kind) {
    case Kind::same:
      for (std::int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
      return;
    case Kind::scalar_b: {
      const TA y = b[0];
      for (std::int64_t i = 0; i < n; ++i) out[i] = f(a[i], y);
      return;
    }
    case Kind::scalar_a: {
      const TA x = a[0];
      for (std::int64_t i = 0; i < n; ++i) out[i] = f(x, b[i]);
      return;
    }
    case Kind::row_b: {
      const std::int64_t m = plan.row;
      for (std::int64_t r = 0; r < n / m; ++r)
        for (std::int64_t j = 0; j < m; ++j) out[r * m + j] = f(a[r * m + j], b[j]);
      return;
    }
    case Kind::general: break;
  }
  const auto nd = plan.out_shape.size();
  std::vector<std::int64_t> index(nd, 0);
  std::int64_t ia = 0, ib = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = f(a[ia], b[ib]);
    for (std::size_t d = nd; d-- > 0;) {  // advance the odometer, innermost dim first
      ia += plan.a_strides[d];
      ib += plan.b_strides[d];
      if (++index[d] < plan.out_shape[d]) break;
      ia -= plan.a_strides[d] * plan.out_shape[d];
      ib -= plan.b_strides[d] * plan.out_shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace troupe::tensor::detail
