#include "troupe/nn/layer_norm.hpp"

#include <cmath>
#include <sstream>

#include "pointwise.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

LayerNorm::LayerNorm(std::int64_t normalized_size, double eps, bool elementwise_affine, DType dtype)
    : size_(normalized_size), eps_(eps) {
  TROUPE_CHECK(normalized_size > 0, "LayerNorm: normalized_size must be > 0, got ", normalized_size);
  TROUPE_CHECK(eps >= 0, "LayerNorm: eps must be >= 0, got ", eps);
  TROUPE_CHECK(tensor::is_floating(dtype), "LayerNorm: needs a floating dtype, got ", dtype);
  if (elementwise_affine) {
    weight_ = &register_parameter("weight", Tensor::ones({size_}, dtype));
    bias_ = &register_parameter("bias", Tensor::zeros({size_}, dtype));
  }
}

std::string LayerNorm::type_name() const {
  std::ostringstream out;
  out << "LayerNorm(" << size_ << ", eps=" << eps_ << ")";
  return out.str();
}

Tensor LayerNorm::forward_impl(const Tensor& input) {
  const std::string op = type_name() + ".forward";
  TROUPE_CHECK(input.defined() && tensor::is_floating(input.dtype()), op, ": needs a floating input");
  TROUPE_CHECK(input.dim() >= 1 && input.size(-1) == size_, op, ": input ", tensor::to_string(input.shape()),
               " must end in ", size_);
  if (weight_)
    TROUPE_CHECK(input.dtype() == weight_->data.dtype() && input.device() == weight_->data.device(), op,
                 ": input is ", input.dtype(), " on ", input.device(), ", weight is ", weight_->data.dtype(), " on ",
                 weight_->data.device());
  const std::int64_t rows = input.numel() / size_;
  input_ = input;
  if (input.device().is_cuda()) return forward_on_device(input, rows);
  mean_.assign(static_cast<std::size_t>(rows), 0.0);
  rstd_.assign(static_cast<std::size_t>(rows), 0.0);
  Tensor out = Tensor::empty(input.shape(), input.dtype());
  tensor::dispatch_floating(input.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* x = input.data<T>();
    const T* w = weight_ ? weight_->data.data<T>() : nullptr;
    const T* b = bias_ ? bias_->data.data<T>() : nullptr;
    T* y = out.data<T>();
    const double n = static_cast<double>(size_);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * size_;
      T* yr = y + r * size_;
      double sum = 0;
      for (std::int64_t i = 0; i < size_; ++i) sum += static_cast<double>(xr[i]);
      const double mean = sum / n;
      double var = 0;  // two passes: no cancellation when |mean| >> std
      for (std::int64_t i = 0; i < size_; ++i) {
        const double d = static_cast<double>(xr[i]) - mean;
        var += d * d;
      }
      const double rstd = 1.0 / std::sqrt(var / n + eps_);
      mean_[static_cast<std::size_t>(r)] = mean;
      rstd_[static_cast<std::size_t>(r)] = rstd;
      for (std::int64_t i = 0; i < size_; ++i) {
        double v = (static_cast<double>(xr[i]) - mean) * rstd;
        if (w) v = v * static_cast<double>(w[i]) + static_cast<double>(b[i]);
        yr[i] = T(static_cast<tensor::compute_t<T>>(v));
      }
    }
  });
  return out;
}

Tensor LayerNorm::backward_impl(const Tensor& grad_output) {
  const std::string op = type_name() + ".backward";
  TROUPE_CHECK(input_.defined(), op, ": called before forward");
  TROUPE_CHECK(grad_output.defined() && grad_output.shape() == input_.shape() &&
                   grad_output.dtype() == input_.dtype() && grad_output.device() == input_.device(),
               op, ": grad_output must be ", input_.dtype(), " ", tensor::to_string(input_.shape()), " on ",
               input_.device(), ", got ", grad_output.dtype(), " ", tensor::to_string(grad_output.shape()), " on ",
               grad_output.device());
  const std::int64_t rows = input_.numel() / size_;
  if (input_.device().is_cuda()) return backward_on_device(grad_output, rows);
  const auto n = static_cast<std::size_t>(size_);
  Tensor grad_input = Tensor::empty(input_.shape(), input_.dtype());
  std::vector<double> dweight(weight_ ? n : 0, 0.0), dbias(bias_ ? n : 0, 0.0);
  tensor::dispatch_floating(input_.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using C = tensor::compute_t<T>;
    const T* x = input_.data<T>();
    const T* gy = grad_output.data<T>();
    const T* w = weight_ ? weight_->data.data<T>() : nullptr;
    T* gx = grad_input.data<T>();
    std::vector<double> xhat(n), dnorm(n);
    for (std::int64_t r = 0; r < rows; ++r) {
      const double mean = mean_[static_cast<std::size_t>(r)], rstd = rstd_[static_cast<std::size_t>(r)];
      const T* xr = x + r * size_;
      const T* gyr = gy + r * size_;
      double mean_dnorm = 0, mean_dnorm_xhat = 0;
      for (std::size_t i = 0; i < n; ++i) {
        xhat[i] = (static_cast<double>(xr[i]) - mean) * rstd;
        const double g = static_cast<double>(gyr[i]);
        dnorm[i] = w ? g * static_cast<double>(w[i]) : g;
        mean_dnorm += dnorm[i];
        mean_dnorm_xhat += dnorm[i] * xhat[i];
        if (w) {
          dweight[i] += g * xhat[i];
          dbias[i] += g;
        }
      }
      mean_dnorm /= static_cast<double>(n);
      mean_dnorm_xhat /= static_cast<double>(n);
      T* gxr = gx + r * size_;
      for (std::size_t i = 0; i < n; ++i)
        gxr[i] = T(static_cast<C>(rstd * (dnorm[i] - mean_dnorm - xhat[i] * mean_dnorm_xhat)));
    }
    if (weight_) {
      // Both parameter gradients are final only after the last row.
      T* gb = grad_for_accumulation(*bias_, op.c_str(), "bias").template data<T>();
      for (std::size_t i = 0; i < n; ++i) gb[i] = T(static_cast<C>(static_cast<double>(gb[i]) + dbias[i]));
      grad_ready(*bias_);
      T* gw = grad_for_accumulation(*weight_, op.c_str(), "weight").template data<T>();
      for (std::size_t i = 0; i < n; ++i) gw[i] = T(static_cast<C>(static_cast<double>(gw[i]) + dweight[i]));
      grad_ready(*weight_);
    }
  });
  return grad_input;
}

// The device path: the host loop's formulas as tensor ops in f64 (rows x size, the
// per-row statistics broadcast as [rows, 1]), so CUDA agrees with the CPU's double
// arithmetic to within f64 rounding.
Tensor LayerNorm::forward_on_device(const Tensor& input, std::int64_t rows) {
  using namespace tensor;
  const Tensor x = input.to(DType::f64).reshape({rows, size_});
  const Tensor centred = sub(x, mean(x, 1, true));
  std_ = sqrt(add(mean(mul(centred, centred), 1, true), eps_));
  xhat_ = div(centred, std_);
  Tensor y = xhat_;
  if (weight_) y = add(mul(y, weight_->data.to(DType::f64)), bias_->data.to(DType::f64));
  return y.to(input.dtype()).reshape(input.shape());
}

Tensor LayerNorm::backward_on_device(const Tensor& grad_output, std::int64_t rows) {
  using namespace tensor;
  const std::string op = type_name() + ".backward";
  const Tensor g = grad_output.to(DType::f64).reshape({rows, size_});
  const Tensor dnorm = weight_ ? mul(g, weight_->data.to(DType::f64)) : g;
  const Tensor mean_dnorm = mean(dnorm, 1, true), mean_dnorm_xhat = mean(mul(dnorm, xhat_), 1, true);
  const Tensor grad_input = div(sub(sub(dnorm, mean_dnorm), mul(xhat_, mean_dnorm_xhat)), std_);
  if (weight_) {
    // grad (+)= the sum over rows, added in f64 and rounded once, as the host does.
    Tensor& gb = grad_for_accumulation(*bias_, op.c_str(), "bias");
    gb.copy_(add(gb.to(DType::f64), sum(g, 0)));
    grad_ready(*bias_);
    Tensor& gw = grad_for_accumulation(*weight_, op.c_str(), "weight");
    gw.copy_(add(gw.to(DType::f64), sum(mul(g, xhat_), 0)));
    grad_ready(*weight_);
  }
  return grad_input.to(input_.dtype()).reshape(input_.shape());
}

}  // namespace troupe::nn
