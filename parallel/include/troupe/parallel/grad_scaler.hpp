// GradScaler: dynamic loss scaling for mixed-precision training (torch.amp.GradScaler).
//
// f16 gradients underflow to zero for small values, so the loss is multiplied by a
// large scale before backward (pass scale() to the loss's backward) and the
// gradients are divided by it again before the optimizer step. When a gradient
// overflowed (inf or NaN), the step is skipped and the scale halves (backoff); after
// `growth_interval` good steps in a row it doubles (growth).
//
// Distributed: the inf/NaN verdict is all-reduced (max) over the communicator, so a
// step is skipped on every rank or on none. With DDP's averaged gradients an inf on
// one rank already poisons every rank's average, but under no_sync, or with
// gradients sharded across ranks, each rank sees different values: only an agreed
// verdict keeps the ranks' parameters identical.
//
// Per step: backward with loss scaled by scale(), then step(optimizer) (which
// unscales if unscale_() was not called, e.g. for clipping), then update().
// state_dict() holds scale, growth tracker and the options: it is part of the
// checkpointable training state.
#pragma once

#include <cstdint>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/nn/state_dict.hpp"

namespace troupe::parallel {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16: large enough that f16 gradients rarely underflow
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;  // good steps in a row before the scale grows
  bool enabled = true;                  // disabled: scale() is 1 and step() always steps
};

class GradScaler {
 public:
  // `comm` may be null (one process); otherwise it must outlive the scaler and every
  // rank must call unscale_/step in the same order.
  explicit GradScaler(collectives::Communicator* comm, GradScalerOptions options = {});

  double scale() const { return options_.enabled ? scale_ : 1.0; }
  const GradScalerOptions& options() const { return options_; }
  bool enabled() const { return options_.enabled; }

  // Divides every defined gradient of `optimizer`'s parameters by scale() and checks
  // them for inf/NaN, agreeing across ranks. Once per step; returns found_inf().
  bool unscale_(nn::Optimizer& optimizer);
  // Unscales (unless done) and steps unless an overflow was found. True if it stepped.
  bool step(nn::Optimizer& optimizer);
  // Adjusts the scale from this step's verdict and readies the next step.
  void update();

  // The verdict of the current step (after unscale_).
  bool found_inf() const { return found_inf_; }
  std::int64_t growth_tracker() const { return growth_tracker_; }
  // Steps skipped so far (for logs).
  std::int64_t skipped_steps() const { return skipped_; }

  nn::StateDict state_dict() const;
  void load_state_dict(const nn::StateDict& dict);

 private:
  collectives::Communicator* comm_;
  GradScalerOptions options_;
  double scale_;
  std::int64_t growth_tracker_ = 0;
  std::int64_t skipped_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace troupe::parallel
