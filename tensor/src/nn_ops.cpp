// Activation gradients, softmax cross-entropy and LayerNorm: the host loop or the CUDA kernel,
// over the same formulas (nn_math.hpp; the cross-entropy's in double on the host, but
// for f32 logits, whose rows run math_loops' vectorised exp with double sums; in the
// compute type on the device).
#include "troupe/tensor/nn_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <vector>

#include "convert.hpp"
#include "cuda/cuda_backend.hpp"
#include "math_loops.hpp"
#include "row_loops.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::tensor {

namespace {

using detail::ActivationGrad;

Tensor activation_backward(ActivationGrad kind, const Tensor& grad_output, const Tensor& saved, const char* op) {
  TROUPE_CHECK(saved.defined() && grad_output.defined(), op, ": undefined ",
               saved.defined() ? "grad_output" : "saved forward tensor");
  TROUPE_CHECK(is_floating(saved.dtype()), op, ": needs a floating dtype, got ", saved.dtype());
  TROUPE_CHECK(grad_output.shape() == saved.shape() && grad_output.dtype() == saved.dtype() &&
                   grad_output.device() == saved.device(),
               op, ": grad_output must be ", saved.dtype(), " ", to_string(saved.shape()), " on ", saved.device(),
               " (the forward's), got ", grad_output.dtype(), " ", to_string(grad_output.shape()), " on ",
               grad_output.device());
  Tensor out = Tensor::empty(saved.shape(), saved.dtype(), saved.device());
  if (saved.numel() == 0) return out;
  if (saved.device().is_cuda()) {
    cuda_backend::activation_grad(kind, saved.dtype(), saved.raw_data(), grad_output.raw_data(), out.raw_data(),
                                  saved.numel());
    return out;
  }
  if (kind == ActivationGrad::gelu_tanh && saved.dtype() == DType::f32) {
    detail::math_loops()->gelu_tanh_backward(saved.data<float>(), grad_output.data<float>(), out.data<float>(),
                                             saved.numel());
    return out;
  }
  dispatch_floating(saved.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* s = saved.data<T>();
    const T* g = grad_output.data<T>();
    T* o = out.data<T>();
    for (std::int64_t i = 0; i < saved.numel(); ++i)
      o[i] = detail::convert<T>(detail::activation_grad(kind, detail::load(s[i]), detail::load(g[i])));
  });
  return out;
}

}  // namespace

Tensor relu_backward(const Tensor& grad_output, const Tensor& input) {
  return activation_backward(ActivationGrad::relu, grad_output, input, "ReLU.backward");
}

Tensor gelu_backward(const Tensor& grad_output, const Tensor& input, bool tanh_approximation) {
  return activation_backward(tanh_approximation ? ActivationGrad::gelu_tanh : ActivationGrad::gelu, grad_output, input,
                             "GELU.backward");
}

Tensor tanh_backward(const Tensor& grad_output, const Tensor& output) {
  return activation_backward(ActivationGrad::tanh, grad_output, output, "Tanh.backward");
}

CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                                          double eps, const char* op) {
  TROUPE_CHECK(logits.defined(), op, ": logits are undefined");
  TROUPE_CHECK(is_floating(logits.dtype()), op, ": needs floating logits, got ", logits.dtype());
  TROUPE_CHECK(logits.dim() >= 1, op, ": logits must have a class dimension, got a 0-dim tensor");
  TROUPE_CHECK(target.defined() && target.dtype() == DType::i64, op, ": target must be an i64 tensor, got ",
               target.defined() ? dtype_name(target.dtype()) : "undefined");
  TROUPE_CHECK(target.device().is_cpu() || target.device() == logits.device(), op, ": target is on ", target.device(),
               ", logits on ", logits.device(), "; the target must be on the CPU or with the logits");
  const Shape rows_shape(logits.shape().begin(), logits.shape().end() - 1);
  TROUPE_CHECK(target.shape() == rows_shape, op, ": logits ", to_string(logits.shape()), " need target ",
               to_string(rows_shape), ", got ", to_string(target.shape()));
  const std::int64_t classes = logits.size(-1);
  const std::int64_t rows = target.numel();
  TROUPE_CHECK(classes > 0 || rows == 0, op, ": logits have 0 classes");

  // Range check on the host, where the error can name the row.
  const Tensor host_target = target.device().is_cpu() ? target : target.to(Device::cpu());
  const std::int64_t* y = host_target.data<std::int64_t>();
  CrossEntropyForward f;
  for (std::int64_t r = 0; r < rows; ++r) {
    TROUPE_CHECK(y[r] == ignore_index || (y[r] >= 0 && y[r] < classes), op, ": target ", y[r], " at row ", r,
                 " is out of range for ", classes, " classes (ignore_index is ", ignore_index, ")");
    if (y[r] != ignore_index) ++f.counted;
  }
  f.target = target.device() == logits.device() ? target : target.to(logits.device());
  f.log_sum_exp = Tensor::zeros({rows}, DType::f64, logits.device());
  const double nan = std::numeric_limits<double>::quiet_NaN();

  if (logits.device().is_cuda()) {
    Tensor row_loss = Tensor::empty({rows}, DType::f64, logits.device());
    if (rows > 0)
      cuda_backend::cross_entropy_rows(
          logits.dtype(), logits.raw_data(), static_cast<const std::int64_t*>(f.target.raw_data()), rows, classes,
          ignore_index, eps, static_cast<double*>(f.log_sum_exp.raw_data()), static_cast<double*>(row_loss.raw_data()));
    f.loss = f.counted > 0 ? mul(sum(row_loss), 1.0 / static_cast<double>(f.counted)).to(logits.dtype())
                           : Tensor::full({}, nan, logits.dtype(), logits.device());
    return f;
  }

  double* lse = f.log_sum_exp.data<double>();
  const double n_classes = static_cast<double>(classes);
  double total = 0;
  // Row r's loss from its log-sum-exp (in lse[r]): the sum over c of -log p_c, for the
  // smoothing, is C * lse - the sum of the logits.
  const auto add_row = [&](std::int64_t r, double target_logit, double sum_logits) {
    const double nll = lse[r] - target_logit;
    total += (1.0 - eps) * nll + eps / n_classes * (n_classes * lse[r] - sum_logits);
  };
  if (logits.dtype() == DType::f32) {
    const detail::MathLoops* loops = detail::math_loops();
    const float* x = logits.data<float>();
    for (std::int64_t r = 0; r < rows; ++r) {
      if (y[r] == ignore_index) continue;
      const float* row = x + r * classes;
      double sum_logits = 0;
      lse[r] = loops->log_sum_exp_row(row, classes, eps != 0 ? &sum_logits : nullptr);
      add_row(r, static_cast<double>(row[y[r]]), sum_logits);
    }
  } else {
    dispatch_floating(logits.dtype(), op, [&](auto tag) {
      using T = decltype(tag);
      const T* x = logits.data<T>();
      for (std::int64_t r = 0; r < rows; ++r) {
        if (y[r] == ignore_index) continue;
        const T* row = x + r * classes;
        double max = -std::numeric_limits<double>::infinity();
        for (std::int64_t c = 0; c < classes; ++c) max = std::max(max, static_cast<double>(row[c]));
        double sum_exp = 0, sum_logits = 0;
        for (std::int64_t c = 0; c < classes; ++c) {
          sum_exp += std::exp(static_cast<double>(row[c]) - max);
          sum_logits += static_cast<double>(row[c]);
        }
        lse[r] = max + std::log(sum_exp);
        add_row(r, static_cast<double>(row[y[r]]), sum_logits);
      }
    });
  }
  f.loss = Tensor::full({}, f.counted > 0 ? total / static_cast<double>(f.counted) : nan, logits.dtype());
  return f;
}

// d loss / d logit[i, c] = (p[i, c] - q[i, c]) * scale / counted, with the smoothed
// target q = (1 - eps) * onehot(y_i) + eps / C; ignored rows get zero.
Tensor cross_entropy_backward(const Tensor& logits, const CrossEntropyForward& f, std::int64_t ignore_index, double eps,
                              double scale) {
  const std::int64_t classes = logits.size(-1);
  const std::int64_t rows = f.target.numel();
  if (f.counted == 0 || logits.device().is_cuda()) {
    Tensor grad = Tensor::zeros(logits.shape(), logits.dtype(), logits.device());
    if (f.counted > 0)
      cuda_backend::cross_entropy_grad(logits.dtype(), logits.raw_data(),
                                       static_cast<const std::int64_t*>(f.target.raw_data()),
                                       static_cast<const double*>(f.log_sum_exp.raw_data()), rows, classes,
                                       ignore_index, eps, scale / static_cast<double>(f.counted), grad.raw_data());
    return grad;
  }
  // Every row is written below (ignored ones with zeros): no zero-fill first, which at
  // GPT-2's vocabulary would be another pass over 200 MB.
  Tensor grad = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  const double factor = scale / static_cast<double>(f.counted);
  const double off = eps / static_cast<double>(classes);
  const std::int64_t* y = f.target.data<std::int64_t>();
  const double* lse = f.log_sum_exp.data<double>();
  if (logits.dtype() == DType::f32) {
    const detail::MathLoops* loops = detail::math_loops();
    const float* x = logits.data<float>();
    float* g = grad.data<float>();
    for (std::int64_t r = 0; r < rows; ++r) {
      float* grow = g + r * classes;
      if (y[r] == ignore_index) {
        std::memset(grow, 0, static_cast<std::size_t>(classes) * sizeof(float));
        continue;
      }
      loops->cross_entropy_grad_row(x + r * classes, classes, y[r], static_cast<float>(lse[r]),
                                    static_cast<float>(1.0 - eps), static_cast<float>(off), static_cast<float>(factor),
                                    grow);
    }
    return grad;
  }
  dispatch_floating(logits.dtype(), "CrossEntropyLoss.backward", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* x = logits.data<T>();
    T* g = grad.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      if (y[r] == ignore_index) {
        std::fill_n(g + r * classes, classes, T(static_cast<C>(0)));
        continue;
      }
      const T* row = x + r * classes;
      T* grow = g + r * classes;
      for (std::int64_t c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(row[c]) - lse[r]);
        const double q = (c == y[r] ? 1.0 - eps : 0.0) + off;
        grow[c] = T(static_cast<C>((p - q) * factor));
      }
    }
  });
  return grad;
}

namespace {

struct Rows {
  std::int64_t rows, n;
};

// x's rows, and each of `params` that is defined checked to be [n] of x's dtype and device.
Rows layer_norm_rows(const Tensor& x, std::initializer_list<const Tensor*> params, const char* op) {
  TROUPE_CHECK(x.defined() && is_floating(x.dtype()) && x.dim() >= 1, op, ": x must be a floating tensor");
  const std::int64_t n = x.size(-1);
  for (const Tensor* t : params)
    if (t->defined())
      TROUPE_CHECK(t->dim() == 1 && t->size(0) == n && t->dtype() == x.dtype() && t->device() == x.device(), op,
                   ": weight and bias must be ", x.dtype(), " [", n, "] on ", x.device(), ", got ", t->dtype(), " ",
                   to_string(t->shape()), " on ", t->device());
  return {n > 0 ? x.numel() / n : 0, n};
}

}  // namespace

LayerNormForward layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "layer_norm";
  TROUPE_CHECK(weight.defined() == bias.defined(), op, ": weight and bias must be given together");
  const Rows shape = layer_norm_rows(x, {&weight, &bias}, op);
  const std::int64_t rows = shape.rows, n = shape.n;  // not a structured binding: lambdas capture these
  TROUPE_CHECK(n > 0 && eps >= 0, op, ": needs rows of at least one element and eps >= 0");
  LayerNormForward f{Tensor::empty(x.shape(), x.dtype(), x.device()), Tensor::empty({rows}, DType::f64, x.device()),
                     Tensor::empty({rows}, DType::f64, x.device())};
  if (rows == 0) return f;
  if (x.device().is_cuda()) {
    cuda_backend::layer_norm_forward(x.dtype(), x.raw_data(), weight.defined() ? weight.raw_data() : nullptr,
                                     bias.defined() ? bias.raw_data() : nullptr, rows, n, eps, f.out.raw_data(),
                                     static_cast<double*>(f.mean.raw_data()), static_cast<double*>(f.rstd.raw_data()));
    return f;
  }
  double* means = f.mean.data<double>();
  double* rstds = f.rstd.data<double>();
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    if constexpr (std::is_same_v<T, float>)
      detail::math_loops()->layer_norm_forward(x.data<T>(), w, b, rows, n, eps, f.out.data<T>(), means, rstds);
    else
      detail::layer_norm_forward_rows(x.data<T>(), w, b, rows, n, eps, f.out.data<T>(), means, rstds);
  });
  return f;
}

Tensor layer_norm_backward(const Tensor& grad_out, const Tensor& x, const LayerNormForward& forward,
                           const Tensor& weight, Tensor* grad_weight, Tensor* grad_bias) {
  const char* op = "layer_norm backward";
  const Rows shape = layer_norm_rows(x, {&weight}, op);
  const std::int64_t rows = shape.rows, n = shape.n;
  TROUPE_CHECK(grad_out.defined() && grad_out.shape() == x.shape() && grad_out.dtype() == x.dtype() &&
                   grad_out.device() == x.device(),
               op, ": grad_out must be ", x.dtype(), " ", to_string(x.shape()), " on ", x.device());
  TROUPE_CHECK(forward.mean.defined() && forward.mean.numel() == rows && forward.rstd.numel() == rows &&
                   forward.mean.device() == x.device(),
               op, ": the forward's statistics do not match x ", to_string(x.shape()));
  const bool affine = weight.defined();
  if (affine)
    for (Tensor* g : {grad_weight, grad_bias})
      TROUPE_CHECK(
          g && g->defined() && g->shape() == weight.shape() && g->dtype() == x.dtype() && g->device() == x.device(), op,
          ": with a weight, grad_weight and grad_bias must be ", x.dtype(), " [", n, "]");
  Tensor gx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) return gx;
  if (x.device().is_cuda()) {
    cuda_backend::layer_norm_backward(
        x.dtype(), x.raw_data(), grad_out.raw_data(), affine ? weight.raw_data() : nullptr,
        static_cast<const double*>(forward.mean.raw_data()), static_cast<const double*>(forward.rstd.raw_data()), rows,
        n, gx.raw_data(), affine ? grad_weight->raw_data() : nullptr, affine ? grad_bias->raw_data() : nullptr);
    return gx;
  }
  std::vector<double> dweight(affine ? static_cast<std::size_t>(n) : 0, 0.0),
      dbias(affine ? static_cast<std::size_t>(n) : 0, 0.0), scratch(2 * static_cast<std::size_t>(n));
  const detail::LayerNormGrads work{affine ? dweight.data() : nullptr, affine ? dbias.data() : nullptr, scratch.data(),
                                    scratch.data() + n};
  const double* means = forward.mean.data<double>();
  const double* rstds = forward.rstd.data<double>();
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* w = affine ? weight.data<T>() : nullptr;
    if constexpr (std::is_same_v<T, float>)
      detail::math_loops()->layer_norm_backward(x.data<T>(), grad_out.data<T>(), w, means, rstds, rows, n, gx.data<T>(),
                                                work);
    else
      detail::layer_norm_backward_rows(x.data<T>(), grad_out.data<T>(), w, means, rstds, rows, n, gx.data<T>(), work);
    if (affine) {  // both gradients are final only after the last row
      using C = compute_t<T>;
      T* gb = grad_bias->data<T>();
      T* gw = grad_weight->data<T>();
      for (std::int64_t i = 0; i < n; ++i) {
        gb[i] = T(static_cast<C>(static_cast<double>(gb[i]) + dbias[static_cast<std::size_t>(i)]));
        gw[i] = T(static_cast<C>(static_cast<double>(gw[i]) + dweight[static_cast<std::size_t>(i)]));
      }
    }
  });
  return gx;
}

namespace {

void check_row_indices(const Tensor& indices, const char* op) {
  TROUPE_CHECK(indices.defined() && indices.dtype() == DType::i64 && indices.device().is_cpu(), op,
               ": indices must be an i64 tensor on the host");
}

}  // namespace

Tensor gather_rows(const Tensor& table, const Tensor& indices) {
  const char* op = "gather_rows";
  check_row_indices(indices, op);
  TROUPE_CHECK(table.defined() && table.dim() == 2, op, ": table must be [rows, dim]");
  const std::int64_t n = indices.numel(), dim = table.size(1);
  Tensor out = Tensor::empty({n, dim}, table.dtype(), table.device());
  if (n == 0 || dim == 0) return out;
  if (table.device().is_cuda()) {
    const Tensor idx = indices.to(table.device());
    cuda_backend::gather_rows(table.dtype(), table.raw_data(), static_cast<const std::int64_t*>(idx.raw_data()), n, dim,
                              out.raw_data());
    return out;
  }
  const std::size_t row_bytes = static_cast<std::size_t>(dim) * table.element_bytes();
  const auto* src = static_cast<const char*>(table.raw_data());
  auto* dst = static_cast<char*>(out.raw_data());
  const std::int64_t* ip = indices.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i)
    std::memcpy(dst + static_cast<std::size_t>(i) * row_bytes, src + static_cast<std::size_t>(ip[i]) * row_bytes,
                row_bytes);
  return out;
}

void scatter_add_rows_(Tensor& dst, const Tensor& indices, const Tensor& src) {
  const char* op = "scatter_add_rows_";
  check_row_indices(indices, op);
  TROUPE_CHECK(dst.defined() && dst.dim() == 2 && src.defined() && src.dtype() == dst.dtype() &&
                   src.device() == dst.device() && src.numel() == indices.numel() * dst.size(1),
               op, ": src must be ", dst.dtype(), " [", indices.numel(), ", ", dst.size(1), "] on ", dst.device());
  const std::int64_t n = indices.numel(), dim = dst.size(1);
  const std::int64_t* ip = indices.data<std::int64_t>();
  if (n == 0 || dim == 0) return;
  if (dst.device().is_cuda()) {
    // The positions of each touched row, in order (a CSR built on the host), so every
    // row's sum runs in index order on one thread per column: the host loop's order.
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return ip[a] < ip[b]; });
    std::vector<std::int64_t> rows, offsets;
    for (std::size_t p = 0; p < order.size(); ++p) {
      if (p == 0 || ip[order[p]] != ip[order[p - 1]]) {
        rows.push_back(ip[order[p]]);
        offsets.push_back(static_cast<std::int64_t>(p));
      }
    }
    offsets.push_back(n);
    const auto upload = [&](const std::vector<std::int64_t>& v) { return Tensor::from_vector(v).to(dst.device()); };
    const Tensor d_rows = upload(rows), d_offsets = upload(offsets), d_positions = upload(order);
    cuda_backend::scatter_add_rows(dst.dtype(), dst.raw_data(), static_cast<const std::int64_t*>(d_rows.raw_data()),
                                   static_cast<const std::int64_t*>(d_offsets.raw_data()),
                                   static_cast<const std::int64_t*>(d_positions.raw_data()),
                                   static_cast<std::int64_t>(rows.size()), dim, src.raw_data());
    return;
  }
  dispatch_floating(dst.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* s = src.data<T>();
    T* d = dst.data<T>();
    for (std::int64_t i = 0; i < n; ++i) {
      T* row = d + ip[i] * dim;
      const T* from = s + i * dim;
      for (std::int64_t j = 0; j < dim; ++j) row[j] = T(static_cast<C>(row[j]) + static_cast<C>(from[j]));
    }
  });
}

}  // namespace troupe::tensor
