#include "troupe/parallel/grad_scaler.hpp"

#include <cmath>

#include "troupe/error.hpp"
#include "troupe/tensor/fused_optim.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

GradScaler::GradScaler(collectives::Communicator* comm, GradScalerOptions options)
    : comm_(comm), options_(options), scale_(options.init_scale) {
  TROUPE_CHECK(options_.init_scale > 0 && std::isfinite(options_.init_scale),
               "GradScaler: init_scale must be finite and > 0, got ", options_.init_scale);
  TROUPE_CHECK(options_.growth_factor > 1, "GradScaler: growth_factor must be > 1, got ", options_.growth_factor);
  TROUPE_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
               "GradScaler: backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  TROUPE_CHECK(options_.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ",
               options_.growth_interval);
}

bool GradScaler::unscale_(nn::Optimizer& optimizer) {
  if (!options_.enabled) return false;
  TROUPE_CHECK(!unscaled_, "GradScaler::unscale_: already called since the last update()");
  const double inverse = 1.0 / scale_;
  bool local_inf = false;
  // CUDA f32 gradients go through one fused kernel each (unscale + inf check) that
  // raises a flag on the device; the host reads it once, after the last of them.
  Tensor device_flag;
  for (const auto& [name, param] : optimizer.named_parameters()) {
    Tensor& grad = param->grad;
    if (!grad.defined()) continue;
    if (grad.device().is_cuda() && grad.dtype() == DType::f32) {
      if (!device_flag.defined()) device_flag = Tensor::zeros({1}, DType::f32, grad.device());
      tensor::unscale_and_check_(grad, inverse, device_flag);
      continue;
    }
    // The sum is accumulated in double, so it is inf or NaN only if an element is.
    if (!std::isfinite(tensor::sum(grad).item())) local_inf = true;
    tensor::scale_(grad, inverse);
  }
  if (device_flag.defined() && device_flag.item() > 0) local_inf = true;
  float flag = local_inf ? 1.0f : 0.0f;
  if (comm_ != nullptr) comm_->allreduce(collectives::Buffer(&flag, 1), collectives::ReduceOp::max);
  found_inf_ = flag > 0;
  unscaled_ = true;
  return found_inf_;
}

bool GradScaler::step(nn::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (!unscaled_) unscale_(optimizer);
  if (found_inf_) {
    ++skipped_;
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  TROUPE_CHECK(unscaled_, "GradScaler::update: call step() (or unscale_()) first in this step");
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

nn::StateDict GradScaler::state_dict() const {
  nn::StateDict dict;
  auto f64 = [](double v) { return Tensor::full({}, v, DType::f64); };
  auto i64 = [](std::int64_t v) { return Tensor::full({}, static_cast<double>(v), DType::i64); };
  dict.insert("scale", f64(scale_));
  dict.insert("growth_factor", f64(options_.growth_factor));
  dict.insert("backoff_factor", f64(options_.backoff_factor));
  dict.insert("growth_interval", i64(options_.growth_interval));
  dict.insert("growth_tracker", i64(growth_tracker_));
  dict.insert("skipped_steps", i64(skipped_));
  return dict;
}

void GradScaler::load_state_dict(const nn::StateDict& dict) {
  const double scale = dict.at("scale").item();
  TROUPE_CHECK(scale > 0 && std::isfinite(scale), "GradScaler::load_state_dict: 'scale' must be finite and > 0, got ",
               scale);
  const auto tracker = static_cast<std::int64_t>(dict.at("growth_tracker").item());
  TROUPE_CHECK(tracker >= 0, "GradScaler::load_state_dict: 'growth_tracker' must be >= 0, got ", tracker);
  options_.growth_factor = dict.at("growth_factor").item();
  options_.backoff_factor = dict.at("backoff_factor").item();
  options_.growth_interval = static_cast<std::int64_t>(dict.at("growth_interval").item());
  if (const Tensor* skipped = dict.find("skipped_steps")) skipped_ = static_cast<std::int64_t>(skipped->item());
  scale_ = scale;
  growth_tracker_ = tracker;
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace troupe::parallel
