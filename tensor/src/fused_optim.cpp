// Checks and scalars of the fused steps, then the host loop or the CUDA kernel, both
// over optim_step.hpp's per-element functions.
#include "troupe/tensor/fused_optim.hpp"

#include <cmath>
#include <memory>

#include "cuda/cuda_backend.hpp"
#include "math_loops.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::tensor {

namespace {

void check_buffer(const Tensor& t, const Tensor& like, const char* op, const char* what) {
  TROUPE_CHECK(t.defined(), op, ": ", what, " is undefined");
  TROUPE_CHECK(t.dtype() == DType::f32, op, ": ", what, " must be f32, got ", t.dtype());
  TROUPE_CHECK(t.numel() == like.numel() && t.device() == like.device(), op, ": ", what, " is ", to_string(t.shape()),
               " on ", t.device(), ", the parameter ", to_string(like.shape()), " on ", like.device());
}

// The checks of one SGD or Adam step, shared by the single and the list forms.
void check_sgd(const Tensor& param, const Tensor& grad, const Tensor* momentum_buffer, const SgdStep& o,
               const char* op) {
  check_buffer(param, param, op, "param");
  check_buffer(grad, param, op, "grad");
  TROUPE_CHECK(o.momentum == 0 || momentum_buffer != nullptr, op, ": momentum ", o.momentum,
               " needs a momentum buffer");
  if (o.momentum != 0) check_buffer(*momentum_buffer, param, op, "momentum buffer");
}

void check_adam(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& o, const char* op) {
  check_buffer(param, param, op, "param");
  check_buffer(grad, param, op, "grad");
  check_buffer(exp_avg, param, op, "exp_avg");
  check_buffer(exp_avg_sq, param, op, "exp_avg_sq");
  TROUPE_CHECK(o.step >= 1, op, ": step must count this step (>= 1), got ", o.step);
}

detail::SgdScalars sgd_scalars(const SgdStep& o) {
  return {static_cast<float>(o.lr),
          static_cast<float>(o.weight_decay),
          static_cast<float>(o.momentum),
          static_cast<float>(1 - o.dampening),
          o.nesterov,
          o.first_step};
}

// As nn's Adam: the bias corrections in double, 1 - beta in double before rounding
// (in f32, 1 - float(0.999) is off by 1e-5 relative).
detail::AdamScalars adam_scalars(const AdamStep& o) {
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(o.step));
  return {static_cast<float>(o.beta1),
          static_cast<float>(o.beta2),
          static_cast<float>(1 - o.beta1),
          static_cast<float>(1 - o.beta2),
          static_cast<float>(o.eps),
          static_cast<float>(o.weight_decay),
          static_cast<float>(1 - o.lr * o.weight_decay),
          static_cast<float>(o.lr / bias_correction1),
          static_cast<float>(std::sqrt(bias_correction2)),
          o.decoupled};
}

std::int64_t numel_of(const AdamEntry& e) { return e.param->numel(); }
std::int64_t numel_of(const SgdEntry& e) { return e.param->numel(); }
std::int64_t numel_of(const Tensor* t) { return t->numel(); }

// Packs the entries' chunks into lists (cuda_backend.hpp) and launches each when its
// tensors or blocks run out; `fill(list, t, entry)` sets tensor t's pointers and scalars.
template <class List, class Entry, class Fill, class Launch>
void launch_lists(std::span<const Entry> entries, Fill fill, Launch launch) {
  using cuda_backend::kListBlocks, cuda_backend::kListChunk, cuda_backend::kListTensors;
  auto list = std::make_unique<List>();  // ~15 KB: not on the stack
  int tensors = 0;
  const auto flush = [&] {
    launch(*list);
    tensors = 0;
    list->blocks = 0;
  };
  for (const Entry& e : entries) {
    const std::int64_t n = numel_of(e);
    const std::int64_t chunks = (n + kListChunk - 1) / kListChunk;
    for (std::int64_t c = 0; c < chunks;) {
      if (tensors == kListTensors) flush();
      const int t = tensors++;
      fill(*list, t, e);
      list->n[t] = n;
      for (; c < chunks && list->blocks < kListBlocks; ++c, ++list->blocks) {
        list->tensor_of[list->blocks] = static_cast<std::uint8_t>(t);
        list->chunk_of[list->blocks] = static_cast<std::int32_t>(c);
      }
      if (c < chunks) flush();  // the rest of this tensor goes into the next launch
    }
  }
  flush();
}

void check_same_device(Device device, const Tensor& t, const char* op) {
  TROUPE_CHECK(t.device() == device, op, ": entries on ", device, " and ", t.device(), "; one device per call");
}

}  // namespace

void fused_adam_steps_(std::span<const AdamEntry> entries) {
  const char* op = "fused_adam_steps_";
  if (entries.empty()) return;
  const Device device = entries.front().param->device();
  for (const AdamEntry& e : entries) {
    TROUPE_CHECK(e.param && e.grad && e.exp_avg && e.exp_avg_sq, op, ": an entry has a null tensor");
    check_adam(*e.param, *e.grad, *e.exp_avg, *e.exp_avg_sq, e.step, op);
    check_same_device(device, *e.param, op);
  }
  if (device.is_cpu()) {
    for (const AdamEntry& e : entries) fused_adam_step_(*e.param, *e.grad, *e.exp_avg, *e.exp_avg_sq, e.step);
    return;
  }
  launch_lists<cuda_backend::AdamList>(
      entries,
      [](cuda_backend::AdamList& list, int t, const AdamEntry& e) {
        list.param[t] = static_cast<float*>(e.param->raw_data());
        list.grad[t] = static_cast<const float*>(e.grad->raw_data());
        list.exp_avg[t] = static_cast<float*>(e.exp_avg->raw_data());
        list.exp_avg_sq[t] = static_cast<float*>(e.exp_avg_sq->raw_data());
        list.scalars[t] = adam_scalars(e.step);
      },
      &cuda_backend::adam_steps);
}

void fused_sgd_steps_(std::span<const SgdEntry> entries) {
  const char* op = "fused_sgd_steps_";
  if (entries.empty()) return;
  const Device device = entries.front().param->device();
  for (const SgdEntry& e : entries) {
    TROUPE_CHECK(e.param && e.grad, op, ": an entry has a null tensor");
    check_sgd(*e.param, *e.grad, e.momentum_buffer, e.step, op);
    check_same_device(device, *e.param, op);
  }
  if (device.is_cpu()) {
    for (const SgdEntry& e : entries) fused_sgd_step_(*e.param, *e.grad, e.momentum_buffer, e.step);
    return;
  }
  launch_lists<cuda_backend::SgdList>(
      entries,
      [](cuda_backend::SgdList& list, int t, const SgdEntry& e) {
        list.param[t] = static_cast<float*>(e.param->raw_data());
        list.grad[t] = static_cast<const float*>(e.grad->raw_data());
        list.momentum_buffer[t] = e.step.momentum != 0 ? static_cast<float*>(e.momentum_buffer->raw_data()) : nullptr;
        list.scalars[t] = sgd_scalars(e.step);
      },
      &cuda_backend::sgd_steps);
}

void fused_sgd_step_(Tensor& param, const Tensor& grad, Tensor* momentum_buffer, const SgdStep& o) {
  check_sgd(param, grad, momentum_buffer, o, "fused_sgd_step_");
  const detail::SgdScalars s = sgd_scalars(o);
  float* p = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* b = o.momentum != 0 ? static_cast<float*>(momentum_buffer->raw_data()) : nullptr;
  if (param.device().is_cuda()) return cuda_backend::sgd_step(p, g, b, param.numel(), s);
  for (std::int64_t i = 0; i < param.numel(); ++i) detail::sgd_element(p[i], g[i], b == nullptr ? nullptr : b + i, s);
}

void fused_adam_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamStep& o) {
  check_adam(param, grad, exp_avg, exp_avg_sq, o, "fused_adam_step_");
  const detail::AdamScalars s = adam_scalars(o);
  float* p = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* m = static_cast<float*>(exp_avg.raw_data());
  float* v = static_cast<float*>(exp_avg_sq.raw_data());
  if (param.device().is_cuda()) return cuda_backend::adam_step(p, g, m, v, param.numel(), s);
  detail::math_loops()->adam(p, g, m, v, param.numel(), s);
}

double fused_sum_of_squares(std::span<const Tensor* const> tensors) {
  const char* op = "fused_sum_of_squares";
  if (tensors.empty()) return 0;
  TROUPE_CHECK(tensors.front() != nullptr, op, ": a tensor is null");
  const Device device = tensors.front()->device();
  std::int64_t chunks = 0;
  for (const Tensor* t : tensors) {
    TROUPE_CHECK(t != nullptr && t->defined(), op, ": a tensor is null or undefined");
    TROUPE_CHECK(t->dtype() == DType::f32, op, ": tensors must be f32, got ", t->dtype());
    check_same_device(device, *t, op);
    chunks += (t->numel() + cuda_backend::kListChunk - 1) / cuda_backend::kListChunk;
  }
  if (device.is_cpu()) {
    double sum = 0;
    for (const Tensor* t : tensors) {
      const float* x = static_cast<const float*>(t->raw_data());
      for (std::int64_t i = 0; i < t->numel(); ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    }
    return sum;
  }
  if (chunks == 0) return 0;
  Tensor partials = Tensor::empty({chunks + 1}, DType::f64, device);  // the chunks' sums, then the total
  auto* sums = static_cast<double*>(partials.raw_data());
  std::int64_t done = 0;
  launch_lists<cuda_backend::SquaresList>(
      tensors,
      [](cuda_backend::SquaresList& list, int t, const Tensor* x) {
        list.data[t] = static_cast<const float*>(x->raw_data());
      },
      [&](const cuda_backend::SquaresList& list) {
        cuda_backend::sum_squares_chunks(list, sums + done);
        done += list.blocks;
      });
  cuda_backend::sum_in_order(sums, chunks, sums + chunks);
  return partials.slice(chunks, chunks + 1).item();
}

void fused_scale_(std::span<Tensor* const> tensors, double factor) {
  const char* op = "fused_scale_";
  if (tensors.empty()) return;
  TROUPE_CHECK(tensors.front() != nullptr, op, ": a tensor is null");
  const Device device = tensors.front()->device();
  for (const Tensor* t : tensors) {
    TROUPE_CHECK(t != nullptr && t->defined(), op, ": a tensor is null or undefined");
    TROUPE_CHECK(t->dtype() == DType::f32, op, ": tensors must be f32, got ", t->dtype());
    check_same_device(device, *t, op);
  }
  if (device.is_cpu()) {
    for (Tensor* t : tensors) scale_(*t, factor);
    return;
  }
  launch_lists<cuda_backend::ScaleList>(
      tensors,
      [](cuda_backend::ScaleList& list, int t, Tensor* x) { list.data[t] = static_cast<float*>(x->raw_data()); },
      [&](const cuda_backend::ScaleList& list) { cuda_backend::scale_chunks(list, static_cast<float>(factor)); });
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
