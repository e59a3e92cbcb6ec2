// DistributedDataParallel::optimizer_step_with_gradient_accumulation: windows of
// micro-batches, one all-reduce and one optimizer step per window.
#include <algorithm>

#include "troupe/error.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/grad_scaler.hpp"
#include "troupe/parallel/master_weights.hpp"
#include "troupe/parallel/tensor_parallel.hpp"

namespace troupe::parallel {

AccumulationStep DistributedDataParallel::optimizer_step_with_gradient_accumulation(
    nn::Optimizer& optimizer, const std::function<Tensor(double)>& output_grad, int accum_steps,
    std::int64_t steps_per_epoch, const AccumulationOptions& options) {
  TROUPE_CHECK(accum_steps >= 1, "optimizer_step_with_gradient_accumulation: accum_steps must be >= 1, got ",
               accum_steps);
  TROUPE_CHECK(steps_per_epoch >= 1, "optimizer_step_with_gradient_accumulation: steps_per_epoch must be >= 1, got ",
               steps_per_epoch);
  TROUPE_CHECK(micro_step_ < steps_per_epoch, "optimizer_step_with_gradient_accumulation: micro-step ", micro_step_,
               " is past the epoch's ", steps_per_epoch, " steps (steps_per_epoch changed mid-epoch?)");
  TROUPE_CHECK(options.max_grad_norm >= 0, "optimizer_step_with_gradient_accumulation: max_grad_norm must be >= 0");

  // The window holding this micro-step; the epoch's last window may be short, and is
  // scaled by its own size so that every step averages over the samples it saw.
  const std::int64_t window_start = micro_step_ / accum_steps * accum_steps;
  const std::int64_t window = std::min<std::int64_t>(accum_steps, steps_per_epoch - window_start);
  const bool last_in_window = micro_step_ + 1 == window_start + window;

  AccumulationStep result;
  result.window = static_cast<int>(window);
  const double loss_scale = options.scaler != nullptr ? options.scaler->scale() : 1.0;
  const Tensor grad = output_grad(loss_scale / static_cast<double>(window));
  if (!last_in_window) {
    auto guard = no_sync();
    TraceScope span(options.tracer, "compute", "backward");
    backward(grad);
  } else {
    {
      TraceScope span(options.tracer, "compute", "backward");
      backward(grad);
    }
    TraceScope span(options.tracer, "compute", "optimizer");
    if (options.sequence_parallel) {
      TROUPE_CHECK(options.tensor_parallel != nullptr,
                   "optimizer_step_with_gradient_accumulation: sequence parallelism needs the tp communicator");
      sequence_parallel_sum_gradients(module_, *options.tensor_parallel);
    }
    result.synced = sync_enabled();
    if (options.master != nullptr) options.master->copy_gradients_to_master();
    if (options.scaler != nullptr) options.scaler->unscale_(optimizer);
    const bool overflow = options.scaler != nullptr && options.scaler->found_inf();
    if (options.max_grad_norm > 0 && !overflow)
      result.grad_norm = options.tensor_parallel != nullptr
                             ? tensor_parallel_clip_grad_norm(module_, options.max_grad_norm, *options.tensor_parallel)
                             : nn::clip_grad_norm(optimizer.named_parameters(), options.max_grad_norm);
    if (options.scaler != nullptr) {
      result.stepped = options.scaler->step(optimizer);
      options.scaler->update();
    } else {
      optimizer.step();
      result.stepped = true;
    }
    result.skipped = !result.stepped;
    if (options.master != nullptr) {
      if (result.stepped) options.master->copy_master_to_model();
      // The model's own grads are not the optimizer's: clear them here too.
      if (options.set_to_none) module_.zero_grad(true);
    }
    // Either way the next window starts from zero; the bucket views are restored by
    // the next backward when the grads are dropped.
    if (options.set_to_none)
      optimizer.zero_grad(true);
    else
      zero_grad();
  }
  micro_step_ = (micro_step_ + 1) % steps_per_epoch;
  return result;
}

}  // namespace troupe::parallel
