#include "troupe/nn/clip.hpp"

#include <cmath>

#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

namespace {

double squared_norm(const Tensor& g) {
  if (!g.device().is_cpu()) {
    const double n = tensor::norm(g).item();
    return n * n;
  }
  // Eight partial sums in a fixed order: one running sum is a chain of dependent adds
  // (a third of the time of a GPT's clipping), and the vectoriser may not reorder it.
  constexpr int kLanes = 8;
  double lanes[kLanes] = {};
  tensor::dispatch_floating(g.dtype(), "clip_grad_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* p = g.data<T>();
    const std::int64_t n = g.numel();
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const double v = static_cast<double>(p[i + l]);
        lanes[l] += v * v;
      }
    for (int l = 0; i < n; ++i, ++l) {
      const double v = static_cast<double>(p[i]);
      lanes[l] += v * v;
    }
  });
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace

double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm) {
  TROUPE_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  double sum_squares = 0;
  for (const Parameter* p : params) {
    TROUPE_CHECK(p != nullptr, "clip_grad_norm: null parameter");
    if (p->grad.defined()) sum_squares += squared_norm(p->grad);
  }
  const double total = std::sqrt(sum_squares);
  // PyTorch's 1e-6 keeps the factor finite when every gradient is zero.
  const double factor = max_norm / (total + 1e-6);
  if (std::isfinite(total) && factor < 1.0)
    for (Parameter* p : params)
      if (p->grad.defined()) tensor::scale_(p->grad, factor);
  return total;
}

double clip_grad_norm(const std::vector<NamedParameter>& params, double max_norm) {
  std::vector<Parameter*> plain;
  plain.reserve(params.size());
  for (const auto& named : params) plain.push_back(named.param);
  return clip_grad_norm(plain, max_norm);
}

}  // namespace troupe::nn
