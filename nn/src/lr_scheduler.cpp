#include "troupe/nn/lr_scheduler.hpp"

#include <cmath>
#include <numbers>

#include "troupe/error.hpp"

namespace troupe::nn {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer), base_lr_(optimizer.lr()) {}

void LRScheduler::apply() { optimizer_.set_lr(lr_at(last_step_)); }

void LRScheduler::step() {
  ++last_step_;
  apply();
}

StateDict LRScheduler::state_dict() const {
  StateDict out;
  out.insert("last_step", Tensor::full({}, static_cast<double>(last_step_), DType::i64));
  out.insert("base_lr", Tensor::full({}, base_lr_, DType::f64));
  return out;
}

void LRScheduler::load_state_dict(const StateDict& dict) {
  const Tensor& step = dict.at("last_step");
  const Tensor& base = dict.at("base_lr");
  TROUPE_CHECK(step.numel() == 1 && step.dtype() == DType::i64 && base.numel() == 1 && base.dtype() == DType::f64,
               "LRScheduler.load_state_dict: want one i64 'last_step' and one f64 'base_lr', got ", step.dtype(), " ",
               tensor::to_string(step.shape()), " and ", base.dtype(), " ", tensor::to_string(base.shape()));
  const auto last = static_cast<std::int64_t>(step.item());
  TROUPE_CHECK(last >= 0, "LRScheduler.load_state_dict: last_step must be >= 0, got ", last);
  last_step_ = last;
  base_lr_ = base.item();
  apply();
}

StepLR::StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  TROUPE_CHECK(step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
  TROUPE_CHECK(gamma >= 0, "StepLR: gamma must be >= 0, got ", gamma);
  apply();
}

double StepLR::lr_at(std::int64_t step) const {
  return base_lr() * std::pow(gamma_, static_cast<double>(step / step_size_));
}

CosineWithWarmup::CosineWithWarmup(Optimizer& optimizer, std::int64_t warmup_steps, std::int64_t total_steps,
                                   double min_lr)
    : LRScheduler(optimizer), warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr) {
  TROUPE_CHECK(warmup_steps >= 0 && total_steps > warmup_steps,
               "CosineWithWarmup: need 0 <= warmup_steps < total_steps, got warmup ", warmup_steps, ", total ",
               total_steps);
  TROUPE_CHECK(min_lr >= 0 && min_lr <= base_lr(), "CosineWithWarmup: min_lr must be in [0, base lr ", base_lr(),
               "], got ", min_lr);
  apply();
}

double CosineWithWarmup::lr_at(std::int64_t step) const {
  if (step < warmup_) return base_lr() * static_cast<double>(step) / static_cast<double>(warmup_);
  if (step >= total_) return min_lr_;
  const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  return min_lr_ + (base_lr() - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace troupe::nn
