#include "troupe/nn/clip.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/tensor/fused_optim.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

namespace {

bool all_f32(const std::vector<Tensor*>& grads) {
  return std::all_of(grads.begin(), grads.end(), [](const Tensor* g) { return g->dtype() == tensor::DType::f32; });
}

// The squared norm of gradients on one GPU with one synchronisation. A read-back per
// gradient made clipping 6 ms of a GPT-2-small step (148 tensors); f32 gradients take
// the list kernels (a few launches for all), others queue each norm into a slot of a
// device vector and read back only that vector's norm.
double squared_norm_on_device(const std::vector<Tensor*>& grads) {
  if (all_f32(grads)) return tensor::fused_sum_of_squares(std::vector<const Tensor*>(grads.begin(), grads.end()));
  Tensor norms = Tensor::empty({static_cast<std::int64_t>(grads.size())}, tensor::DType::f64, grads.front()->device());
  for (std::size_t i = 0; i < grads.size(); ++i)
    norms.select(static_cast<std::int64_t>(i)).copy_(tensor::norm(*grads[i]));
  const double total = tensor::norm(norms).item();
  return total * total;
}

double squared_norm(const Tensor& g) {
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
  std::vector<Tensor*> on_host;
  std::vector<std::pair<Device, std::vector<Tensor*>>> on_devices;  // GPU gradients, by device
  for (Parameter* p : params) {
    TROUPE_CHECK(p != nullptr, "clip_grad_norm: null parameter");
    if (!p->grad.defined()) continue;
    const Device device = p->grad.device();
    if (device.is_cpu()) {
      sum_squares += squared_norm(p->grad);
      on_host.push_back(&p->grad);
      continue;
    }
    auto group = std::find_if(on_devices.begin(), on_devices.end(), [&](const auto& g) { return g.first == device; });
    if (group == on_devices.end()) group = on_devices.insert(on_devices.end(), {device, {}});
    group->second.push_back(&p->grad);
  }
  for (const auto& [device, grads] : on_devices) sum_squares += squared_norm_on_device(grads);
  const double total = std::sqrt(sum_squares);
  // PyTorch's 1e-6 keeps the factor finite when every gradient is zero.
  const double factor = max_norm / (total + 1e-6);
  if (!std::isfinite(total) || factor >= 1.0) return total;
  for (Tensor* g : on_host) tensor::scale_(*g, factor);
  // 148 scale_ launches were launch-bound on a GPT-2-small step; the list kernel gives
  // the same bits in a few.
  for (const auto& [device, grads] : on_devices)
    if (all_f32(grads)) {
      tensor::fused_scale_(grads, factor);
    } else {
      for (Tensor* g : grads) tensor::scale_(*g, factor);
    }
  return total;
}

double clip_grad_norm(const std::vector<NamedParameter>& params, double max_norm) {
  std::vector<Parameter*> plain;
  plain.reserve(params.size());
  for (const auto& named : params) plain.push_back(named.param);
  return clip_grad_norm(plain, max_norm);
}

}  // namespace troupe::nn
