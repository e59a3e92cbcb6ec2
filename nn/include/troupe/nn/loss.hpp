// Losses with an explicit backward: CrossEntropyLoss and MSELoss (mean reduction,
// as PyTorch's defaults), and accuracy() for reporting.
//
// A loss's forward returns a 0-dim tensor of the input's dtype and caches what
// backward needs; backward(scale) returns d(scale * loss)/d(input), the gradient
// that starts a model's backward. `scale` is there for loss scaling and for
// averaging over gradient-accumulation micro-steps. forward keeps handles to its
// inputs (backward recomputes softmax from the logits): don't write into them
// before backward.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/tensor/nn_ops.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::nn {

using tensor::Tensor;

// torch.nn.CrossEntropyLoss with class-index targets.
//
// logits [N, C] (or [..., C], read as if flattened to rows) and i64 targets [N]
// (or [...]). With p = softmax(logits) per row and eps = label_smoothing:
//   loss_i = (1 - eps) * (-log p[i, y_i]) + eps * mean over c of (-log p[i, c])
// averaged over the rows whose target is not ignore_index -- exactly PyTorch's
// formula. When every row is ignored the loss is NaN, as in PyTorch (0 / 0), and
// the gradient is zero. Log-softmax subtracts each row's max first, so large logits
// don't overflow; row arithmetic is in double on the CPU, in f32 (f64 for f64
// logits) on CUDA. On CUDA the targets may be on the CPU or on the GPU; either way
// they are range-checked on the host (tensor/nn_ops.hpp), and the loss stays on the
// GPU until it is read.
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(std::int64_t ignore_index = -100, double label_smoothing = 0.0);

  // A target outside [0, C) that isn't ignore_index is an error naming it and its row.
  Tensor forward(const Tensor& logits, const Tensor& target);
  // Gradient with respect to the logits of the last forward, times `scale`.
  Tensor backward(double scale = 1.0) const;

  std::int64_t ignore_index() const { return ignore_index_; }
  double label_smoothing() const { return label_smoothing_; }

 private:
  std::int64_t ignore_index_;
  double label_smoothing_;
  Tensor logits_;
  tensor::CrossEntropyForward forward_;  // targets, per-row log-sum-exp, rows counted
};

// torch.nn.MSELoss: mean of (input - target)^2 over all elements.
class MSELoss {
 public:
  Tensor forward(const Tensor& input, const Tensor& target);
  // 2 (input - target) / numel * scale, with respect to the input.
  Tensor backward(double scale = 1.0) const;

 private:
  Tensor input_, target_;
};

// Fraction of rows whose argmax over the last dimension equals the target, among
// rows whose target is not ignore_index (0 when there are none).
double accuracy(const Tensor& logits, const Tensor& target, std::int64_t ignore_index = -100);

}  // namespace troupe::nn
