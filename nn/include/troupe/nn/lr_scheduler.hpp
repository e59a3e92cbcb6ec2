// Learning-rate schedules: a function of the step number that sets the optimizer's
// lr, as torch.optim.lr_scheduler.
//
// A scheduler remembers the optimizer's lr at construction as base_lr and sets
// lr_at(0) at once; each step() advances last_step by one and sets
// lr_at(last_step). Call it once per optimizer step, after optimizer.step(), as in
// PyTorch. The schedules are closed forms of the step, so state_dict() needs only
// last_step and base_lr to resume exactly, and load_state_dict() re-applies the lr.
#pragma once

#include <cstdint>

#include "troupe/nn/optimizer.hpp"
#include "troupe/nn/state_dict.hpp"

namespace troupe::nn {

class LRScheduler {
 public:
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;
  virtual ~LRScheduler() = default;

  void step();
  std::int64_t last_step() const { return last_step_; }
  double base_lr() const { return base_lr_; }
  // The learning rate this schedule gives at `step` (>= 0).
  virtual double lr_at(std::int64_t step) const = 0;

  // "last_step" (0-dim i64) and "base_lr" (0-dim f64).
  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Sets the optimizer's lr for last_step; derived constructors call it last,
  // once lr_at can run.
  void apply();

 private:
  Optimizer& optimizer_;
  double base_lr_;
  std::int64_t last_step_ = 0;
};

// torch.optim.lr_scheduler.StepLR: base_lr * gamma^floor(step / step_size).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1);
  double lr_at(std::int64_t step) const override;

 private:
  std::int64_t step_size_;
  double gamma_;
};

// Linear warm-up from 0 to base_lr over warmup_steps, then half a cosine from
// base_lr down to min_lr at total_steps, then min_lr:
//   step < warmup:          base_lr * step / warmup
//   warmup <= step < total: min_lr + (base_lr - min_lr) * (1 + cos(pi * progress)) / 2,
//                           progress = (step - warmup) / (total - warmup)
//   step >= total:          min_lr
class CosineWithWarmup : public LRScheduler {
 public:
  CosineWithWarmup(Optimizer& optimizer, std::int64_t warmup_steps, std::int64_t total_steps, double min_lr = 0.0);
  double lr_at(std::int64_t step) const override;

 private:
  std::int64_t warmup_, total_;
  double min_lr_;
};

}  // namespace troupe::nn
