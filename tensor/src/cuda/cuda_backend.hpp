// The CUDA side of the tensor module, as plain functions over raw pointers so that
// only the plugin's files see the CUDA headers. The plugin (libtroupe_tensor_cuda.so)
// defines them; libtroupe_tensor's cuda_loader.cpp defines them again as forwarders to
// the plugin's table, opened on first use (cuda_table.hpp). Without the plugin, the
// device queries say "no device" and every other function throws, saying why.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../nn_math.hpp"
#include "../optim_step.hpp"
#include "troupe/tensor/caching_allocator.hpp"
#include "troupe/tensor/dtype.hpp"

namespace troupe::tensor::cuda_backend {

enum class CopyKind { host_to_device, device_to_host, device_to_device };
// Arithmetic writes the operands' dtype; comparisons (eq ... ge) write u8 0/1.
enum class BinaryOp { add, sub, mul, div, eq, ne, lt, le, gt, ge };
// Floating-only: sqrt ... gelu_tanh. clamp uses [lo, hi]; the others ignore them.
enum class UnaryOp { neg, abs, relu, clamp, sqrt, exp, log, tanh, sigmoid, gelu, gelu_tanh };
enum class ReduceOp { sum, mean, max, min, norm, argmax };

// Where element i of a broadcast result reads its operands: the output's shape and,
// per output dimension, each operand's stride (0 where it is stretched).
constexpr int kMaxBroadcastDims = 8;
struct BroadcastIndex {
  int nd = 0;
  std::int64_t out_shape[kMaxBroadcastDims] = {};
  std::int64_t a_strides[kMaxBroadcastDims] = {};
  std::int64_t b_strides[kMaxBroadcastDims] = {};
};

int device_count();
// Waits for everything queued on the current device.
void synchronize();
// An event queued on the current device's default stream now (timelines); the time
// from one to a later one, waiting for the later; and the event freed.
void* event_record();
double event_elapsed_ms(void* from, void* to);
void event_destroy(void* event);
void set_device(int device);
// Device memory, through the caching allocator (cuda_memory.cpp): a released block
// goes back to its size class's free list, not to cudaFree.
void* allocate(std::size_t nbytes, int device);
void release(void* data, int device);
void copy(void* dst, const void* src, std::size_t nbytes, CopyKind kind);
void fill(void* data, DType dtype, std::int64_t n, double value);
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n);
// out = a op b elementwise, all n long; b_is_scalar reads b[0] for every element.
void binary(BinaryOp op, DType dtype, const void* a, const void* b, bool b_is_scalar, void* out, std::int64_t n);
// out[i] = a[ia(i)] op b[ib(i)] for the n elements of index.out_shape.
void binary_broadcast(BinaryOp op, DType dtype, const void* a, const void* b, const BroadcastIndex& index, void* out,
                      std::int64_t n);
// out[i] = op(in[i]); in may equal out.
void unary(UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n, double lo, double hi);
// in seen as [outer, n, inner] -> out [outer, inner] of out_dtype (in_dtype, or i64 for
// argmax and integer sums). Accumulates f16/bf16 in f32, f32/f64 in f64, integers in i64.
void reduce(ReduceOp op, DType in_dtype, const void* in, DType out_dtype, void* out, std::int64_t outer, std::int64_t n,
            std::int64_t inner);
void axpy(DType dtype, void* y, double alpha, const void* x, std::int64_t n);
void scale(DType dtype, void* data, double alpha, std::int64_t n);
void random_uniform(DType dtype, void* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double lo,
                    double hi);
void random_normal(DType dtype, void* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double mean,
                   double std);
// The [dst_rows, dst_cols] block at dst (rows dst_ld apart) from the [rows, cols] block
// at src (rows src_ld apart), zeros where src has no cell; 2-byte elements (the padded
// operands of gemm's 16-bit products).
void copy_rows_2byte(const void* src, std::int64_t src_ld, std::int64_t rows, std::int64_t cols, void* dst,
                     std::int64_t dst_ld, std::int64_t dst_rows, std::int64_t dst_cols);
// Whether f32 products may take TF32 (tensor/cuda_math.hpp): read by gemm,
// linear_bias and f32 attention at each call.
void set_allow_tf32(bool allow);
bool allow_tf32();
// Row-major C[m,n] = alpha * op(A) op(B) + beta * C, through cuBLAS.
void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const void* a, const void* b, double beta, void* c);
// Row-major y[m,n] = x[m,k] w[n,k]^T + bias[n] in one cuBLASLt call, the bias added in
// the product's epilogue (f32). False, with nothing done, where that path does not
// take the product (another dtype, a degenerate shape, a misaligned bias, no kernel):
// the caller then multiplies and adds.
bool linear_bias(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const void* x, const void* w,
                 const void* bias, void* y);

// ---- fused optimizer steps and the GradScaler check over flat f32 buffers (cuda_optim.cu) ----
// Each is one kernel launch over n elements; the scalars are computed on the host.
using detail::AdamScalars;
using detail::SgdScalars;
void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, const SgdScalars& s);
void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
               const AdamScalars& s);
// Many tensors per launch: a tensor list and, per block, which tensor and which
// 64K-element chunk of it (multi_tensor_apply's layout). Passed by value as the
// kernel's argument (CUDA 12.1+ takes up to 32 KB of arguments).
constexpr int kListTensors = 64, kListBlocks = 2048;
constexpr std::int64_t kListChunk = std::int64_t{1} << 16;
struct AdamList {
  float* param[kListTensors];
  const float* grad[kListTensors];
  float* exp_avg[kListTensors];
  float* exp_avg_sq[kListTensors];
  std::int64_t n[kListTensors];
  AdamScalars scalars[kListTensors];
  std::uint8_t tensor_of[kListBlocks];
  std::int32_t chunk_of[kListBlocks];
  int blocks = 0;
};
struct SgdList {
  float* param[kListTensors];
  const float* grad[kListTensors];
  float* momentum_buffer[kListTensors];  // null without momentum
  std::int64_t n[kListTensors];
  SgdScalars scalars[kListTensors];
  std::uint8_t tensor_of[kListBlocks];
  std::int32_t chunk_of[kListBlocks];
  int blocks = 0;
};
void adam_steps(const AdamList& list);
void sgd_steps(const SgdList& list);
struct SquaresList {
  const float* data[kListTensors];
  std::int64_t n[kListTensors];
  std::uint8_t tensor_of[kListBlocks];
  std::int32_t chunk_of[kListBlocks];
  int blocks = 0;
};
// partials[b] = the sum of squares of block b's chunk, in double.
void sum_squares_chunks(const SquaresList& list, double* partials);
// *out = values[0] + ... + values[n - 1], in an order fixed by n alone.
void sum_in_order(const double* values, std::int64_t n, double* out);
struct ScaleList {
  float* data[kListTensors];
  std::int64_t n[kListTensors];
  std::uint8_t tensor_of[kListBlocks];
  std::int32_t chunk_of[kListBlocks];
  int blocks = 0;
};
// Every element of the blocks' chunks *= factor (scale's float product).
void scale_chunks(const ScaleList& list, float factor);
// grad *= inv_scale; *found_inf (a device float) becomes 1 if any grad is Inf or NaN.
void unscale_and_check(float* grad, std::int64_t n, float inv_scale, float* found_inf);

// ---- nn's layers and losses (cuda_nn.cu) ----
// out = activation_grad(op, saved, grad) elementwise (nn_math.hpp), floating dtypes.
void activation_grad(detail::ActivationGrad op, DType dtype, const void* saved, const void* grad, void* out,
                     std::int64_t n);
// Per row of logits [rows, classes]: log_sum_exp[r] and the row's loss term
// (1 - eps) * nll + eps / C * sum_c(-log p_c), both 0 where target == ignore_index.
void cross_entropy_rows(DType dtype, const void* logits, const std::int64_t* target, std::int64_t rows,
                        std::int64_t classes, std::int64_t ignore_index, double eps, double* log_sum_exp,
                        double* row_loss);
// grad[r, c] = (softmax - smoothed one-hot) * factor, 0 on ignored rows.
void cross_entropy_grad(DType dtype, const void* logits, const std::int64_t* target, const double* log_sum_exp,
                        std::int64_t rows, std::int64_t classes, std::int64_t ignore_index, double eps, double factor,
                        void* grad);

// LayerNorm (tensor/nn_ops.hpp's contract) over rows of n: a block per row.
// weight/bias may be null (both).
void layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias, std::int64_t rows,
                        std::int64_t n, double eps, void* y, double* mean, double* rstd);
// grad_x; with a weight, grad_weight[c] += sum_r gy * xhat and grad_bias[c] += sum_r gy.
void layer_norm_backward(DType dtype, const void* x, const void* gy, const void* weight, const double* mean,
                         const double* rstd, std::int64_t rows, std::int64_t n, void* gx, void* grad_weight,
                         void* grad_bias);

// out[i, :] = table[idx[i], :] for n rows of `dim` elements.
void gather_rows(DType dtype, const void* table, const std::int64_t* idx, std::int64_t n, std::int64_t dim, void* out);
// For each of `distinct` touched rows k: dst[rows[k], :] += src[positions[p], :] for p in
// [offsets[k], offsets[k + 1]), in that order, rounding to the dtype after each add.
void scatter_add_rows(DType dtype, void* dst, const std::int64_t* rows, const std::int64_t* offsets,
                      const std::int64_t* positions, std::int64_t distinct, std::int64_t dim, const void* src);

// ---- causal self-attention (cuda_attention.cu; tensor/attention.hpp's contract) ----
struct AttentionShape {
  std::int64_t batch, time, channels, heads, head_dim;  // head_dim <= 128
};
struct AttentionDropout {
  double p = 0;  // 0: none
  std::uint64_t seed = 0, offset = 0;
};
// qkv [B, T, 3C] -> out [B, T, C] and lse [B, H, T] (f64 for f64 tensors, else f32).
void attention_forward(DType dtype, const void* qkv, const AttentionShape& shape, const AttentionDropout& dropout,
                       void* out, void* lse);
// grad_qkv [B, T, 3C] from grad_out [B, T, C]; delta is [B, H, T] of lse's type, scratch.
void attention_backward(DType dtype, const void* qkv, const void* out, const void* grad_out, const void* lse,
                        const AttentionShape& shape, const AttentionDropout& dropout, void* delta, void* grad_qkv);

// ---- memory (cuda_memory.cpp) ----
CachingAllocator::Stats memory_stats(int device);
void empty_cache();
// Page-locked host memory (cudaHostAlloc) and its release; nullptr when the driver
// refuses (no device), so the caller can fall back to ordinary host memory.
void* allocate_pinned(std::size_t nbytes);
void release_pinned(void* data);
bool is_pinned(const void* data);

}  // namespace troupe::tensor::cuda_backend
