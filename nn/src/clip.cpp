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
  double total = 0;
  tensor::dispatch_floating(g.dtype(), "clip_grad_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* p = g.data<T>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      const double v = static_cast<double>(p[i]);
      total += v * v;
    }
  });
  return total;
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
