#include <algorithm>
#include <cmath>
#include <limits>

#include "pointwise.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/loss.hpp"

namespace troupe::nn {

namespace {

// Checks logits [..., C] against targets [...] and returns C.
std::int64_t check_logits_and_target(const Tensor& logits, const Tensor& target, const char* op) {
  detail::check_host_floating(logits, op);
  TROUPE_CHECK(logits.dim() >= 1, op, ": logits must have a class dimension, got a 0-dim tensor");
  TROUPE_CHECK(target.defined() && target.dtype() == tensor::DType::i64 && target.device().is_cpu(), op,
               ": target must be an i64 tensor on the CPU, got ",
               target.defined() ? tensor::dtype_name(target.dtype()) : "undefined");
  const tensor::Shape rows_shape(logits.shape().begin(), logits.shape().end() - 1);
  TROUPE_CHECK(target.shape() == rows_shape, op, ": logits ", tensor::to_string(logits.shape()),
               " need target ", tensor::to_string(rows_shape), ", got ", tensor::to_string(target.shape()));
  return logits.size(-1);
}

}  // namespace

CrossEntropyLoss::CrossEntropyLoss(std::int64_t ignore_index, double label_smoothing)
    : ignore_index_(ignore_index), label_smoothing_(label_smoothing) {
  TROUPE_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
               "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", label_smoothing);
}

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& target) {
  const char* op = "CrossEntropyLoss.forward";
  const std::int64_t classes = check_logits_and_target(logits, target, op);
  const std::int64_t rows = target.numel();
  TROUPE_CHECK(classes > 0 || rows == 0, op, ": logits have 0 classes");
  const std::int64_t* y = target.data<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r)
    TROUPE_CHECK(y[r] == ignore_index_ || (y[r] >= 0 && y[r] < classes), op, ": target ", y[r], " at row ", r,
                 " is out of range for ", classes, " classes (ignore_index is ", ignore_index_, ")");

  logits_ = logits;
  target_ = target;
  log_sum_exp_.assign(static_cast<std::size_t>(rows), 0.0);
  counted_ = 0;
  const double eps = label_smoothing_;
  const double n_classes = static_cast<double>(classes);
  double total = 0;
  tensor::dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      if (y[r] == ignore_index_) continue;
      const T* row = x + r * classes;
      double max = -std::numeric_limits<double>::infinity();
      for (std::int64_t c = 0; c < classes; ++c) max = std::max(max, static_cast<double>(row[c]));
      double sum_exp = 0, sum_logits = 0;
      for (std::int64_t c = 0; c < classes; ++c) {
        sum_exp += std::exp(static_cast<double>(row[c]) - max);
        sum_logits += static_cast<double>(row[c]);
      }
      const double lse = max + std::log(sum_exp);
      log_sum_exp_[static_cast<std::size_t>(r)] = lse;
      const double nll = lse - static_cast<double>(row[y[r]]);
      // sum over c of -log p_c = C * lse - sum of logits.
      const double smooth = n_classes * lse - sum_logits;
      total += (1.0 - eps) * nll + eps / n_classes * smooth;
      ++counted_;
    }
  });
  const double loss = counted_ > 0 ? total / static_cast<double>(counted_) : std::nan("");
  return Tensor::full({}, loss, logits.dtype());
}

// d loss / d logit[i, c] = (p[i, c] - q[i, c]) / counted, with the smoothed target
// q = (1 - eps) * onehot(y_i) + eps / C; ignored rows get zero.
Tensor CrossEntropyLoss::backward(double scale) const {
  const char* op = "CrossEntropyLoss.backward";
  TROUPE_CHECK(logits_.defined(), op, ": called before forward");
  const std::int64_t classes = logits_.size(-1);
  const std::int64_t rows = target_.numel();
  const std::int64_t* y = target_.data<std::int64_t>();
  Tensor grad = Tensor::zeros(logits_.shape(), logits_.dtype());
  if (counted_ == 0) return grad;
  const double eps = label_smoothing_;
  const double off = eps / static_cast<double>(classes);
  const double factor = scale / static_cast<double>(counted_);
  tensor::dispatch_floating(logits_.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using C = tensor::compute_t<T>;
    const T* x = logits_.data<T>();
    T* g = grad.data<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      if (y[r] == ignore_index_) continue;
      const double lse = log_sum_exp_[static_cast<std::size_t>(r)];
      const T* row = x + r * classes;
      T* grow = g + r * classes;
      for (std::int64_t c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(row[c]) - lse);
        const double q = (c == y[r] ? 1.0 - eps : 0.0) + off;
        grow[c] = T(static_cast<C>((p - q) * factor));
      }
    }
  });
  return grad;
}

}  // namespace troupe::nn
