// Checks and scalars of the fused steps, then the host loop or the CUDA kernel, both
// over optim_step.hpp's per-element functions.
#include "troupe/tensor/fused_optim.hpp"

#include <cmath>

#include "cuda/cuda_backend.hpp"

namespace troupe::tensor {

namespace {

void check_buffer(const Tensor& t, const Tensor& like, const char* op, const char* what) {
  TROUPE_CHECK(t.defined(), op, ": ", what, " is undefined");
  TROUPE_CHECK(t.dtype() == DType::f32, op, ": ", what, " must be f32, got ", t.dtype());
  TROUPE_CHECK(t.numel() == like.numel() && t.device() == like.device(), op, ": ", what, " is ",
               to_string(t.shape()), " on ", t.device(), ", the parameter ", to_string(like.shape()), " on ",
               like.device());
}

}  // namespace

void fused_sgd_step_(Tensor& param, const Tensor& grad, Tensor* momentum_buffer, const SgdStep& o) {
  const char* op = "fused_sgd_step_";
  check_buffer(param, param, op, "param");
  check_buffer(grad, param, op, "grad");
  TROUPE_CHECK(o.momentum == 0 || momentum_buffer != nullptr, op, ": momentum ", o.momentum,
               " needs a momentum buffer");
  if (o.momentum != 0) check_buffer(*momentum_buffer, param, op, "momentum buffer");
  const detail::SgdScalars s{static_cast<float>(o.lr), static_cast<float>(o.weight_decay),
                                   static_cast<float>(o.momentum), static_cast<float>(1 - o.dampening),
                                   o.nesterov, o.first_step};
  float* p = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* b = o.momentum != 0 ? static_cast<float*>(momentum_buffer->raw_data()) : nullptr;
  if (param.device().is_cuda()) return cuda_backend::sgd_step(p, g, b, param.numel(), s);
  for (std::int64_t i = 0; i < param.numel(); ++i) detail::sgd_element(p[i], g[i], b == nullptr ? nullptr : b + i, s);
}

void fused_adam_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamStep& o) {
  const char* op = "fused_adam_step_";
  check_buffer(param, param, op, "param");
  check_buffer(grad, param, op, "grad");
  check_buffer(exp_avg, param, op, "exp_avg");
  check_buffer(exp_avg_sq, param, op, "exp_avg_sq");
  TROUPE_CHECK(o.step >= 1, op, ": step must count this step (>= 1), got ", o.step);
  // As nn's Adam: the bias corrections in double, 1 - beta in double before rounding
  // (in f32, 1 - float(0.999) is off by 1e-5 relative).
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(o.step));
  const detail::AdamScalars s{static_cast<float>(o.beta1),
                                    static_cast<float>(o.beta2),
                                    static_cast<float>(1 - o.beta1),
                                    static_cast<float>(1 - o.beta2),
                                    static_cast<float>(o.eps),
                                    static_cast<float>(o.weight_decay),
                                    static_cast<float>(1 - o.lr * o.weight_decay),
                                    static_cast<float>(o.lr / bias_correction1),
                                    static_cast<float>(std::sqrt(bias_correction2)),
                                    o.decoupled};
  float* p = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* m = static_cast<float*>(exp_avg.raw_data());
  float* v = static_cast<float*>(exp_avg_sq.raw_data());
  if (param.device().is_cuda()) return cuda_backend::adam_step(p, g, m, v, param.numel(), s);
  for (std::int64_t i = 0; i < param.numel(); ++i) detail::adam_element(p[i], g[i], m[i], v[i], s);
}

void unscale_and_check_(Tensor& grads, double inv_scale, Tensor& found_inf) {
  const char* op = "unscale_and_check_";
  check_buffer(grads, grads, op, "grads");
  TROUPE_CHECK(found_inf.defined() && found_inf.dtype() == DType::f32 && found_inf.numel() == 1 &&
                   found_inf.device() == grads.device(),
               op, ": found_inf must be one f32 element on ", grads.device());
  float* g = static_cast<float*>(grads.raw_data());
  float* flag = static_cast<float*>(found_inf.raw_data());
  const float scale = static_cast<float>(inv_scale);
  if (grads.device().is_cuda()) return cuda_backend::unscale_and_check(g, grads.numel(), scale, flag);
  for (std::int64_t i = 0; i < grads.numel(); ++i) detail::unscale_element(g[i], scale, *flag);
}

}  // namespace troupe::tensor
