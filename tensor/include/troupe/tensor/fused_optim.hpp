// Fused optimizer steps over flat f32 buffers, and GradScaler's unscale + inf check.
//
// Each call updates a whole buffer (a DDP bucket, a ZeRO/FSDP flat shard, or one
// parameter) in one pass: on CUDA one kernel launch (cuda_optim.cu), on the CPU one
// loop. The arithmetic is nn's SGD and Adam/AdamW term for term (PyTorch's
// single-tensor formulas), so nn/ and train/ can hand a CUDA parameter to these and
// get the step their host loop would take. All tensors: f32, one shape (or one
// element count), one device; they are updated in place.
#pragma once

#include <span>

#include <cstdint>

#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor {

struct SgdStep {
  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  // The momentum buffer's first step stores the gradient itself (PyTorch); its
  // contents are not read.
  bool first_step = false;
};
// param -= lr * d, d the (weight-decayed, momentum-filtered) gradient. momentum_buffer
// may be null when momentum is 0.
void fused_sgd_step_(Tensor& param, const Tensor& grad, Tensor* momentum_buffer, const SgdStep& options);

struct AdamStep {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool decoupled = false;  // AdamW: decay the parameter, not the gradient
  std::int64_t step = 1;   // the step count after this step (1 on the first), for the bias corrections
};
void fused_adam_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamStep& options);

// Many steps at once (PyTorch's multi_tensor_apply, optimizers' fused=True): each
// entry its own tensors and scalars (its own step count), on CUDA as few launches as
// the kernel's argument space allows -- one for up to 64 tensors and 2048 chunks of
// 64K elements, e.g. a whole MLP of 25M or 67M parameters -- on the CPU the loops
// above. Entries are checked like the single forms; all must be on one device.
struct AdamEntry {
  Tensor* param;
  const Tensor* grad;
  Tensor* exp_avg;
  Tensor* exp_avg_sq;
  AdamStep step;
};
void fused_adam_steps_(std::span<const AdamEntry> entries);
struct SgdEntry {
  Tensor* param;
  const Tensor* grad;
  Tensor* momentum_buffer;  // null without momentum
  SgdStep step;
};
void fused_sgd_steps_(std::span<const SgdEntry> entries);

// The sum of the squares of every element of `tensors` (f32, all on one device), in
// double: gradient clipping's total norm, squared. On CUDA a partial per 64K-element
// chunk in as few launches as above, summed in a fixed order, and one read-back for
// the lot; on the CPU one loop.
double fused_sum_of_squares(std::span<const Tensor* const> tensors);
// Every element of `tensors` (f32, all on one device) *= factor, in place: clipping's
// scaling, the bits of scale_ on each tensor, on CUDA in as few launches as above.
void fused_scale_(std::span<Tensor* const> tensors, double factor);

// grads *= inv_scale; found_inf (one f32 element, on grads' device) is set to 1 when
// any gradient was Inf or NaN and otherwise left as it was, so one flag can collect
// every buffer of a step before it is all-reduced. No host synchronisation is needed
// to read the verdict later.
void unscale_and_check_(Tensor& grads, double inv_scale, Tensor& found_inf);

}  // namespace troupe::tensor
