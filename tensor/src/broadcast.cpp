#include "broadcast.hpp"

#include <algorithm>

namespace troupe::tensor::detail {

std::vector<std::int64_t> broadcast_strides(const Shape& shape, const Shape& out) {
  const auto nd = out.size(), offset = nd - shape.size();
  std::vector<std::int64_t> strides(nd, 0);
  std::int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d + offset] = shape[d] == 1 ? 0 : stride;
    stride *= shape[d];
  }
  return strides;
}

namespace {

bool is_suffix(const Shape& suffix, const Shape& shape) {
  return suffix.size() <= shape.size() && std::equal(suffix.rbegin(), suffix.rend(), shape.rbegin());
}

}  // namespace

BroadcastPlan plan_broadcast(const Tensor& a, const Tensor& b, const char* op) {
  a.check_defined(op);
  b.check_defined(op);
  TROUPE_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ, ", a.dtype(), " ", to_string(a.shape()), " and ",
               b.dtype(), " ", to_string(b.shape()), " (convert one with to(dtype))");
  TROUPE_CHECK(a.device() == b.device(), op, ": tensors on different devices, ", a.device(), " and ", b.device());
  BroadcastPlan plan;
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const auto nd = std::max(sa.size(), sb.size());
  plan.out_shape.assign(nd, 1);
  for (std::size_t i = 0; i < nd; ++i) {
    const auto da = i < sa.size() ? sa[sa.size() - 1 - i] : 1;
    const auto db = i < sb.size() ? sb[sb.size() - 1 - i] : 1;
    TROUPE_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", to_string(sa), " and ", to_string(sb),
                 " do not broadcast (dimension ", nd - 1 - i, ": ", da, " vs ", db, ")");
    plan.out_shape[nd - 1 - i] = da == 1 ? db : da;
  }
  using Kind = BroadcastPlan::Kind;
  const auto n = shape_numel(plan.out_shape);
  if (sa == sb || (a.numel() == n && b.numel() == n)) {
    plan.kind = Kind::same;
  } else if (b.numel() == 1) {
    plan.kind = Kind::scalar_b;
  } else if (a.numel() == 1) {
    plan.kind = Kind::scalar_a;
  } else if (a.numel() == n && is_suffix(sb, plan.out_shape)) {
    plan.kind = Kind::row_b;
    plan.row = b.numel();
  } else {
    plan.kind = Kind::general;
    plan.a_strides = broadcast_strides(sa, plan.out_shape);
    plan.b_strides = broadcast_strides(sb, plan.out_shape);
  }
  return plan;
}

}  // namespace troupe::tensor::detail
