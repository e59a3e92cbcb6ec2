#include <cmath>

#include "pointwise.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  const char* op = "MSELoss.forward";
  TROUPE_CHECK(input.defined() && target.defined(), op, ": input or target is undefined");
  TROUPE_CHECK(tensor::is_floating(input.dtype()), op, ": needs a floating dtype, got ", input.dtype());
  TROUPE_CHECK(input.shape() == target.shape() && input.dtype() == target.dtype() && input.device() == target.device(),
               op, ": input is ", input.dtype(), " ", tensor::to_string(input.shape()), " on ", input.device(),
               ", target is ", target.dtype(), " ", tensor::to_string(target.shape()), " on ", target.device());
  input_ = input;
  target_ = target;
  if (input.device().is_cuda()) {  // the mean accumulates in double on the device too
    const Tensor d = tensor::sub(input, target);
    return tensor::mean(tensor::mul(d, d));
  }
  double total = 0;
  tensor::dispatch_floating(input.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* x = input.data<T>();
    const T* t = target.data<T>();
    for (std::int64_t i = 0; i < input.numel(); ++i) {
      const double d = static_cast<double>(x[i]) - static_cast<double>(t[i]);
      total += d * d;
    }
  });
  // An empty input gives NaN, as PyTorch's mean of nothing.
  const double loss = input.numel() > 0 ? total / static_cast<double>(input.numel()) : std::nan("");
  return Tensor::full({}, loss, input.dtype());
}

Tensor MSELoss::backward(double scale) const {
  TROUPE_CHECK(input_.defined(), "MSELoss.backward: called before forward");
  const double factor = 2.0 * scale / static_cast<double>(input_.numel() > 0 ? input_.numel() : 1);
  if (input_.device().is_cuda()) return tensor::mul(tensor::sub(input_, target_), factor);
  return detail::map2(input_, target_, "MSELoss.backward", [factor](auto x, auto t) {
    using C = decltype(x);
    return static_cast<C>(factor) * (x - t);
  });
}

}  // namespace troupe::nn
