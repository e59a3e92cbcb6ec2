// The tensor-level pieces of nn's layers and losses that are more than a composition
// of ops.hpp: activation gradients and softmax cross-entropy, on the CPU and on CUDA
// alike (ATen's threshold_backward, gelu_backward, tanh_backward and
// cross_entropy_loss). nn/ calls these, so one layer runs on either device.
#pragma once

#include <cstdint>

#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor {

// d(activation)/d(input) * grad_output, from what the forward saved: relu and gelu
// from their input, tanh from its output. Shapes, dtypes and devices must match.
Tensor relu_backward(const Tensor& grad_output, const Tensor& input);
Tensor gelu_backward(const Tensor& grad_output, const Tensor& input, bool tanh_approximation = false);
Tensor tanh_backward(const Tensor& grad_output, const Tensor& output);

// Softmax cross-entropy of logits [rows, classes] against class indices [rows] (i64,
// on the CPU or on the logits' device), with label smoothing `eps` and rows whose
// target is `ignore_index` left out. The targets are range-checked on the host (a
// CUDA target is copied there: rows * 8 bytes, and a wait for the work before it).
struct CrossEntropyForward {
  Tensor loss;               // 0-dim, the logits' dtype and device: the mean over counted rows (NaN if none)
  Tensor log_sum_exp;        // f64 [rows] on the logits' device, for the backward
  Tensor target;             // the targets on the logits' device
  std::int64_t counted = 0;  // rows not ignored
};
CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target, std::int64_t ignore_index,
                                          double label_smoothing, const char* op);
// d loss / d logits, times `scale`: (softmax - smoothed one-hot) * scale / counted,
// zero on ignored rows.
Tensor cross_entropy_backward(const Tensor& logits, const CrossEntropyForward& forward, std::int64_t ignore_index,
                              double label_smoothing, double scale);

// LayerNorm over the last dimension of x, seen as [rows, n] (torch's layer_norm):
// y = (x - mean) / sqrt(var + eps) * weight + bias, each row's statistics in double
// (a two-pass variance) on either device, every result rounded once to x's dtype.
// weight and bias are [n] of x's dtype and device, both given or both undefined.
struct LayerNormForward {
  Tensor out;         // x's shape and dtype
  Tensor mean, rstd;  // f64 [rows] on x's device: 1 / sqrt(var + eps)
};
LayerNormForward layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// d loss / d x, llm.c's layernorm_backward: rstd (dnorm - mean(dnorm) - xhat
// mean(dnorm xhat)), dnorm = grad_out * weight. With a weight, grad_weight and
// grad_bias (x's dtype, [n]) get the column sums of grad_out * xhat and grad_out
// added: summed in double, rounded once.
Tensor layer_norm_backward(const Tensor& grad_out, const Tensor& x, const LayerNormForward& forward,
                           const Tensor& weight, Tensor* grad_weight, Tensor* grad_bias);

// Embedding's lookup and its gradient. `indices` are i64 on the host (the caller has
// range-checked them), one row index per row of the result / of `src`.
// gather_rows: out[i] = table[indices[i]], [n, dim] on the table's device.
Tensor gather_rows(const Tensor& table, const Tensor& indices);
// scatter_add_rows_: dst[indices[i]] += src[i] for i in order, each add rounded to
// dst's dtype, so the CPU and the GPU (a thread per touched row and column, walking
// that row's positions in order, no atomics) give the same bits.
void scatter_add_rows_(Tensor& dst, const Tensor& indices, const Tensor& src);

}  // namespace troupe::tensor
