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

Tensor Dropout::forward(const Tensor& input) {
  const std::string op = type_name() + ".forward";
  detail::check_host_floating(input, op);
  forward_ran_ = true;
  if (!is_training() || p_ == 0.0) {
    mask_ = Tensor();
    return input;
  }
  const Tensor u = tensor::uniform(input.shape(), 0.0, 1.0, gen_, DType::f32);
  const float keep = static_cast<float>(1.0 - p_);
  // p = 1 drops everything; the scale is then never used, and must not be inf.
  const double scale = p_ < 1.0 ? 1.0 / (1.0 - p_) : 0.0;
  mask_ = Tensor::empty(input.shape(), input.dtype());
  tensor::dispatch_floating(input.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const float* pu = u.data<float>();
    T* m = mask_.data<T>();
    const T kept = T(static_cast<tensor::compute_t<T>>(scale));
    for (std::int64_t i = 0; i < input.numel(); ++i) m[i] = pu[i] < keep ? kept : T(0);
  });
  return tensor::mul(input, mask_);
}

Tensor Dropout::backward(const Tensor& grad_output) {
  TROUPE_CHECK(forward_ran_, type_name(), ".backward: called before forward");
  if (!mask_.defined()) return grad_output;
  return detail::map2(mask_, grad_output, type_name() + ".backward", [](auto m, auto gy) { return m * gy; });
}

}  // namespace troupe::nn
