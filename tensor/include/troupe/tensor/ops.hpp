// Arithmetic on tensors: elementwise, comparisons, reductions, matmul.
//
// Binary elementwise operations broadcast as NumPy and PyTorch do (trailing
// dimensions aligned, size-1 dimensions stretched) and need equal dtypes; there is
// no implicit type promotion, so a mismatch is an error naming both dtypes.
// f16/bf16 compute in f32 and round once on store. Reductions of f16/bf16 accumulate
// in f32, of f32 in f64 (so a sum's error does not grow with the tensor's length),
// and integer sums in i64.
#pragma once

#include <cstdint>

#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor {

// ---- elementwise ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
// In place: `a` keeps its shape, so b must broadcast to a's shape.
Tensor& add_(Tensor& a, const Tensor& b);
Tensor& sub_(Tensor& a, const Tensor& b);
Tensor& mul_(Tensor& a, const Tensor& b);
Tensor& div_(Tensor& a, const Tensor& b);
Tensor& add_(Tensor& a, double b);
// y += alpha * x (same shape), the BLAS axpy.
Tensor& axpy_(Tensor& y, double alpha, const Tensor& x);
// t *= alpha
Tensor& scale_(Tensor& t, double alpha);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }

Tensor neg(const Tensor& t);
Tensor abs(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor sigmoid(const Tensor& t);
// max(x, 0); NaN gives 0, as nn's ReLU.
Tensor relu(const Tensor& t);
// x * Phi(x), or with tanh_approximation PyTorch's approximate='tanh' form.
Tensor gelu(const Tensor& t, bool tanh_approximation = false);
Tensor clamp(const Tensor& t, double lo, double hi);
Tensor& clamp_(Tensor& t, double lo, double hi);

// ---- comparisons: u8 tensors of 0/1, broadcasting like the arithmetic ----
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);

// ---- reductions ----
// Whole tensor -> 0-dim tensor. sum of an integer tensor is i64; mean needs a
// floating dtype; max/min of an empty tensor are errors (there is no identity).
Tensor sum(const Tensor& t);
Tensor mean(const Tensor& t);
Tensor max(const Tensor& t);
Tensor min(const Tensor& t);
// Euclidean (L2) norm.
Tensor norm(const Tensor& t);
// Along one dimension (negative counts from the end).
Tensor sum(const Tensor& t, std::int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& t, std::int64_t dim, bool keepdim = false);
Tensor max(const Tensor& t, std::int64_t dim, bool keepdim = false);
Tensor min(const Tensor& t, std::int64_t dim, bool keepdim = false);
Tensor norm(const Tensor& t, std::int64_t dim, bool keepdim = false);
// Index of the largest element along dim (first one on ties), as i64.
Tensor argmax(const Tensor& t, std::int64_t dim, bool keepdim = false);

// True when shapes match and |a - b| <= atol + rtol * |b| everywhere (NaN never close).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
// True when dtype, shape and every byte match.
bool equal(const Tensor& a, const Tensor& b);

// ---- matmul ----
enum class Transpose : std::uint8_t { no, yes };
// op(a) @ op(b) for 2-D tensors, op = transpose when asked. f32/f64 go straight to
// BLAS (cblas on CPU, cuBLAS on CUDA); f16/bf16 multiply in f32 and round on store;
// integer dtypes use a plain loop.
Tensor matmul(const Tensor& a, const Tensor& b, Transpose ta = Transpose::no, Transpose tb = Transpose::no);
// out = alpha * op(a) @ op(b) + beta * out, into an existing tensor (which may be a
// view into a gradient bucket): beta = 1 accumulates.
void matmul_out(Tensor& out, const Tensor& a, const Tensor& b, Transpose ta = Transpose::no,
                Transpose tb = Transpose::no, double alpha = 1, double beta = 0);
// x @ weight^T + bias, torch.nn.functional.linear on 2-D x: x [rows, in], weight
// [out, in], bias [out] or undefined. On the CPU in f32/f64 the output starts as the
// bias and BLAS adds the product to it (as torch's addmm), one pass over the output
// fewer than a product and then an add.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// Threads the host's matrix products may use, OpenBLAS's and troupe's AVX-512 kernel
// alike (one per rank is the right number under mpirun).
void set_num_threads(int n);

}  // namespace troupe::tensor
