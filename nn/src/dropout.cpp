#include "troupe/nn/dropout.hpp"

#include <sstream>

#include "pointwise.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

Dropout::Dropout(double p, std::uint64_t seed) : p_(p), gen_(seed) {
  TROUPE_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability must be in [0, 1], got ", p);
}

std::string Dropout::type_name() const {
  std::ostringstream out;
  out << "Dropout(p=" << p_ << ")";
  return out.str();
}

Tensor Dropout::forward_impl(const Tensor& input) {
  draw_mask(input, type_name() + ".forward");
  return mask_.defined() ? tensor::mul(input, mask_) : input;
}

Tensor Dropout::forward_for_backward_impl(const Tensor& input) {
  draw_mask(input, type_name() + ".forward");
  return input;
}

void Dropout::draw_mask(const Tensor& input, const std::string& op) {
  TROUPE_CHECK(input.defined(), op, ": input is undefined");
  TROUPE_CHECK(tensor::is_floating(input.dtype()), op, ": needs a floating dtype, got ", input.dtype());
  forward_ran_ = true;
  if (!is_training() || p_ == 0.0) {
    mask_ = Tensor();
    return;
  }
  // The same draws on either device (Philox, counter-based), so a CUDA run drops the
  // same elements as a CPU one.
  const Tensor u = tensor::uniform(input.shape(), 0.0, 1.0, gen_, DType::f32, input.device());
  const float keep = static_cast<float>(1.0 - p_);
  // p = 1 drops everything; the scale is then never used, and must not be inf.
  const double scale = p_ < 1.0 ? 1.0 / (1.0 - p_) : 0.0;
  if (input.device().is_cuda()) {  // mask = (u < keep) * scale, in the input's dtype
    mask_ = tensor::mul(tensor::lt(u, static_cast<double>(keep)).to(input.dtype()), scale);
    return;
  }
  mask_ = Tensor::empty(input.shape(), input.dtype());
  tensor::dispatch_floating(input.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const float* pu = u.data<float>();
    T* m = mask_.data<T>();
    const T kept = T(static_cast<tensor::compute_t<T>>(scale));
    for (std::int64_t i = 0; i < input.numel(); ++i) m[i] = pu[i] < keep ? kept : T(0);
  });
}

Tensor Dropout::backward_impl(const Tensor& grad_output) {
  TROUPE_CHECK(forward_ran_, type_name(), ".backward: called before forward");
  if (!mask_.defined()) return grad_output;
  if (mask_.device().is_cuda()) {
    TROUPE_CHECK(grad_output.defined() && grad_output.shape() == mask_.shape() && grad_output.dtype() == mask_.dtype(),
                 type_name(), ".backward: grad_output must be ", mask_.dtype(), " ", tensor::to_string(mask_.shape()));
    return tensor::mul(grad_output, mask_);
  }
  return detail::map2(mask_, grad_output, type_name() + ".backward", [](auto m, auto gy) { return m * gy; });
}

void Dropout::exchange_own_activations(ActivationStash& stash) {
  stash.exchange(mask_);
  stash.exchange(forward_ran_);
}

}  // namespace troupe::nn
