// Kernels of nn's layers and losses: activation gradients (nn_math.hpp's formulas, as
// the host runs them), softmax cross-entropy (a block per row), LayerNorm (a warp per
// row, in double as the host loop), and Embedding's row gather and in-order scatter-add.
#include <algorithm>

#include <cub/block/block_reduce.cuh>

#include "cuda_device.cuh"

namespace troupe::tensor::cuda_backend {

namespace {

template <class T>
struct ActivationGrad {
  detail::ActivationGrad op;
  __device__ T operator()(T saved, T gy) const {
    return convert_to<T>(detail::activation_grad(op, to_compute(saved), to_compute(gy)));
  }
};

// f64 logits in double, the others in float; the row's results are kept in double.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Cross-entropy runs a block per row, in one pass over the row: GPT-2's logits are
// 8192 rows of 50257, 0.8-1.6 GB, and reading them is the whole cost. Rows start
// wherever the class count puts them, so each row reads its unaligned head and tail
// element by element and the middle in 16-byte vectors.
constexpr int kRowThreads = 512;

// Elements before a row's first 16-byte boundary (all of them in a short row).
template <class T>
__device__ std::int64_t unaligned_head(const T* row, std::int64_t n) {
  const auto misaligned = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(row) % 16);
  const std::int64_t head = misaligned == 0 ? 0 : (16 - misaligned) / static_cast<std::int64_t>(sizeof(T));
  return head < n ? head : n;
}

// f(i, x) for every element x = row[i], this thread's share of the row.
template <class T, class F>
__device__ void for_each_in_row(const T* row, std::int64_t n, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  const std::int64_t head = unaligned_head(row, n);
  for (std::int64_t i = threadIdx.x; i < head; i += blockDim.x) f(i, row[i]);
  const std::int64_t vectors = (n - head) / kVec;
  const auto* middle = reinterpret_cast<const uint4*>(row + head);
  for (std::int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const uint4 raw = middle[v];
    const T* x = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) f(head + v * kVec + j, x[j]);
  }
  for (std::int64_t i = head + vectors * kVec + threadIdx.x; i < n; i += blockDim.x) f(i, row[i]);
}

// out[i] = f(i, in[i]) over a row, this thread's share; 16-byte loads and stores where
// the two rows share an alignment, element by element where they do not.
template <class T, class F>
__device__ void transform_row(const T* in, T* out, std::int64_t n, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  if (reinterpret_cast<std::uintptr_t>(in) % 16 != reinterpret_cast<std::uintptr_t>(out) % 16) {
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = f(i, in[i]);
    return;
  }
  const std::int64_t head = unaligned_head(in, n);
  for (std::int64_t i = threadIdx.x; i < head; i += blockDim.x) out[i] = f(i, in[i]);
  const std::int64_t vectors = (n - head) / kVec;
  const auto* src = reinterpret_cast<const uint4*>(in + head);
  auto* dst = reinterpret_cast<uint4*>(out + head);
  for (std::int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const uint4 raw = src[v];
    const T* x = reinterpret_cast<const T*>(&raw);
    uint4 packed;
    T* y = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = f(head + v * kVec + j, x[j]);
    dst[v] = packed;
  }
  for (std::int64_t i = head + vectors * kVec + threadIdx.x; i < n; i += blockDim.x) out[i] = f(i, in[i]);
}

// A running softmax denominator: sum of exp(x - max) over the elements seen.
template <class C>
struct SoftmaxPartial {
  C max, sum, logits;  // logits: the plain sum, for label smoothing
};

template <class C>
__device__ SoftmaxPartial<C> combine(const SoftmaxPartial<C>& a, const SoftmaxPartial<C>& b) {
  const C m = a.max > b.max ? a.max : b.max;
  if (m == -INFINITY) return {m, C(0), a.logits + b.logits};
  return {m, a.sum * exp(a.max - m) + b.sum * exp(b.max - m), a.logits + b.logits};
}

template <class T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_rows_kernel(const T* logits, const std::int64_t* target, std::int64_t classes,
                              std::int64_t ignore_index, double eps, double* lse_out, double* row_loss) {
  using C = Acc<T>;
  using Reduce = cub::BlockReduce<SoftmaxPartial<C>, kRowThreads>;
  __shared__ typename Reduce::TempStorage scratch;
  const std::int64_t r = blockIdx.x;
  const std::int64_t y = target[r];
  if (y == ignore_index) {  // the same branch for the whole block
    if (threadIdx.x == 0) lse_out[r] = row_loss[r] = 0;
    return;
  }
  const T* row = logits + r * classes;
  SoftmaxPartial<C> mine{-INFINITY, C(0), C(0)};
  for_each_in_row(row, classes, [&](std::int64_t, T raw) {
    const C v = to_compute(raw);
    if (v > mine.max) {  // rescale the sum once per new maximum, not per element
      mine.sum = mine.sum * exp(mine.max - v) + C(1);
      mine.max = v;
    } else if (mine.max != -INFINITY) {  // a -inf logit before any finite one adds nothing
      mine.sum += exp(v - mine.max);
    }
    mine.logits += v;
  });
  const SoftmaxPartial<C> total = Reduce(scratch).Reduce(
      mine, [](const SoftmaxPartial<C>& a, const SoftmaxPartial<C>& b) { return combine(a, b); });
  if (threadIdx.x == 0) {
    const double lse = static_cast<double>(total.max) + log(static_cast<double>(total.sum));
    const double n = static_cast<double>(classes);
    lse_out[r] = lse;
    const double nll = lse - static_cast<double>(to_compute(row[y]));
    row_loss[r] = (1.0 - eps) * nll + eps / n * (n * lse - static_cast<double>(total.logits));
  }
}

// A block per row again: its target and log-sum-exp are read once.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_grad_kernel(const T* logits, const std::int64_t* target, const double* lse, std::int64_t rows,
                              std::int64_t classes, std::int64_t ignore_index, double eps, double factor, T* grad) {
  using C = Acc<T>;
  const C off = static_cast<C>(eps / static_cast<double>(classes));
  const C hit = static_cast<C>(1.0 - eps);
  const C f = static_cast<C>(factor);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* in = logits + r * classes;
    T* out = grad + r * classes;
    const std::int64_t y = target[r];
    if (y == ignore_index) {
      for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) out[c] = convert_to<T>(C(0));
      continue;
    }
    const C m = static_cast<C>(lse[r]);
    transform_row(in, out, classes, [&](std::int64_t c, T x) {
      return convert_to<T>((exp(static_cast<C>(to_compute(x)) - m) - ((c == y ? hit : C(0)) + off)) * f);
    });
  }
}

template <class T>
__global__ void gather_rows_kernel(const T* table, const std::int64_t* idx, std::int64_t n, std::int64_t dim, T* out) {
  TROUPE_GRID_LOOP(i, n * dim) out[i] = table[idx[i / dim] * dim + i % dim];
}

template <class T>
__global__ void scatter_add_rows_kernel(T* dst, const std::int64_t* rows, const std::int64_t* offsets,
                                        const std::int64_t* positions, std::int64_t distinct, std::int64_t dim,
                                        const T* src) {
  TROUPE_GRID_LOOP(t, distinct * dim) {
    const std::int64_t k = t / dim, j = t % dim;
    T* cell = dst + rows[k] * dim + j;
    T acc = *cell;
    for (std::int64_t p = offsets[k]; p < offsets[k + 1]; ++p)
      acc = convert_to<T>(to_compute(acc) + to_compute(src[positions[p] * dim + j]));
    *cell = acc;
  }
}

// LayerNorm: a warp per row (GPT widths are hundreds to a few thousand, and a block
// per row spent its time in block-wide synchronisation); the statistics in double, as
// the host loop computes them.
constexpr int kRowsPerBlock = kThreads / 32;

// The sum of the warp's 32 values, the same bits on every lane: reduced to lane 0 in
// a fixed order, then broadcast (a butterfly would round differently per lane).
__device__ double warp_sum(double v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return __shfl_sync(0xffffffffu, v, 0);
}

template <class T>
__global__ void layer_norm_forward_kernel(const T* x, const T* w, const T* b, std::int64_t rows, std::int64_t n,
                                          double eps, T* y, double* mean_out, double* rstd_out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (std::int64_t r = blockIdx.x * std::int64_t{kRowsPerBlock} + threadIdx.x / 32; r < rows;
       r += std::int64_t{gridDim.x} * kRowsPerBlock) {  // the same trip count on every lane of a warp
    const T* xr = x + r * n;
    double sum = 0;
    for (std::int64_t c = lane; c < n; c += 32) sum += static_cast<double>(to_compute(xr[c]));
    const double mean = warp_sum(sum) / static_cast<double>(n);
    double var = 0;  // two passes: no cancellation when |mean| >> std
    for (std::int64_t c = lane; c < n; c += 32) {
      const double d = static_cast<double>(to_compute(xr[c])) - mean;
      var += d * d;
    }
    const double rstd = 1.0 / ::sqrt(warp_sum(var) / static_cast<double>(n) + eps);
    if (lane == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
    T* yr = y + r * n;
    for (std::int64_t c = lane; c < n; c += 32) {
      double v = (static_cast<double>(to_compute(xr[c])) - mean) * rstd;
      if (w) v = v * static_cast<double>(to_compute(w[c])) + static_cast<double>(to_compute(b[c]));
      yr[c] = convert_to<T>(v);
    }
  }
}

template <class T>
__global__ void layer_norm_backward_kernel(const T* x, const T* gy, const T* w, const double* mean, const double* rstd,
                                           std::int64_t rows, std::int64_t n, T* gx) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (std::int64_t r = blockIdx.x * std::int64_t{kRowsPerBlock} + threadIdx.x / 32; r < rows;
       r += std::int64_t{gridDim.x} * kRowsPerBlock) {
    const T* xr = x + r * n;
    const T* gr = gy + r * n;
    const double m = mean[r], rs = rstd[r];
    const auto dnorm_at = [&](std::int64_t c) {
      const double g = static_cast<double>(to_compute(gr[c]));
      return w ? g * static_cast<double>(to_compute(w[c])) : g;
    };
    double s1 = 0, s2 = 0;
    for (std::int64_t c = lane; c < n; c += 32) {
      const double dn = dnorm_at(c);
      s1 += dn;
      s2 += dn * ((static_cast<double>(to_compute(xr[c])) - m) * rs);
    }
    const double dnorm = warp_sum(s1) / static_cast<double>(n);
    const double dnorm_xhat = warp_sum(s2) / static_cast<double>(n);
    T* gxr = gx + r * n;
    for (std::int64_t c = lane; c < n; c += 32) {
      const double xhat = (static_cast<double>(to_compute(xr[c])) - m) * rs;
      gxr[c] = convert_to<T>(rs * (dnorm_at(c) - dnorm - xhat * dnorm_xhat));
    }
  }
}

// The weight and bias gradients: thread (p, c) sums part p of column c's rows; the
// finish kernel adds the parts in order (deterministic) to what the gradients hold.
template <class T>
__global__ void layer_norm_param_parts_kernel(const T* x, const T* gy, const double* mean, const double* rstd,
                                              std::int64_t rows, std::int64_t n, std::int64_t parts, double* part_w,
                                              double* part_b) {
  const std::int64_t chunk = (rows + parts - 1) / parts;
  TROUPE_GRID_LOOP(t, n * parts) {
    const std::int64_t c = t % n, p = t / n;
    const std::int64_t begin = p * chunk, end = begin + chunk < rows ? begin + chunk : rows;
    double sw = 0, sb = 0;
    for (std::int64_t r = begin; r < end; ++r) {
      const double g = static_cast<double>(to_compute(gy[r * n + c]));
      sw += g * ((static_cast<double>(to_compute(x[r * n + c])) - mean[r]) * rstd[r]);
      sb += g;
    }
    part_w[c * parts + p] = sw;
    part_b[c * parts + p] = sb;
  }
}

template <class T>
__global__ void layer_norm_param_finish_kernel(const double* part_w, const double* part_b, std::int64_t n,
                                               std::int64_t parts, T* gw, T* gb) {
  TROUPE_GRID_LOOP(c, n) {
    double sw = 0, sb = 0;
    for (std::int64_t p = 0; p < parts; ++p) {
      sw += part_w[c * parts + p];
      sb += part_b[c * parts + p];
    }
    gw[c] = convert_to<T>(static_cast<double>(to_compute(gw[c])) + sw);
    gb[c] = convert_to<T>(static_cast<double>(to_compute(gb[c])) + sb);
  }
}

}  // namespace

void layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias, std::int64_t rows,
                        std::int64_t n, double eps, void* y, double* mean, double* rstd) {
  dispatch_floating(dtype, "layer_norm", [&](auto tag) {
    using T = decltype(tag);
    layer_norm_forward_kernel<<<blocks_for(rows * 32), kThreads>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), rows, n, eps,
        static_cast<T*>(y), mean, rstd);
  });
  finish("layer_norm");
}

void layer_norm_backward(DType dtype, const void* x, const void* gy, const void* weight, const double* mean,
                         const double* rstd, std::int64_t rows, std::int64_t n, void* gx, void* grad_weight,
                         void* grad_bias) {
  dispatch_floating(dtype, "layer_norm backward", [&](auto tag) {
    using T = decltype(tag);
    const auto* xt = static_cast<const T*>(x);
    const auto* gyt = static_cast<const T*>(gy);
    layer_norm_backward_kernel<<<blocks_for(rows * 32), kThreads>>>(xt, gyt, static_cast<const T*>(weight), mean, rstd,
                                                                    rows, n, static_cast<T*>(gx));
    finish("layer_norm backward");
    if (!grad_weight) return;
    // Rows split into parts of >= 64 until about 2048 blocks of threads are busy.
    const std::int64_t parts = std::max<std::int64_t>(
        1, std::min<std::int64_t>((rows + 63) / 64, 2048 * kThreads / std::max<std::int64_t>(n, 1)));
    int device = 0;
    TROUPE_CUDA_CHECK(cudaGetDevice(&device));
    const std::size_t bytes = static_cast<std::size_t>(2 * n * parts) * sizeof(double);
    auto* scratch = static_cast<double*>(allocate(bytes, device));
    layer_norm_param_parts_kernel<<<blocks_for(n * parts), kThreads>>>(xt, gyt, mean, rstd, rows, n, parts, scratch,
                                                                       scratch + n * parts);
    layer_norm_param_finish_kernel<<<blocks_for(n), kThreads>>>(
        scratch, scratch + n * parts, n, parts, static_cast<T*>(grad_weight), static_cast<T*>(grad_bias));
    release(scratch,
            device);  // the caching allocator's blocks are reused in stream order
    finish("layer_norm parameter gradients");
  });
}

void gather_rows(DType dtype, const void* table, const std::int64_t* idx, std::int64_t n, std::int64_t dim, void* out) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    gather_rows_kernel<<<blocks_for(n * dim), kThreads>>>(static_cast<const T*>(table), idx, n, dim,
                                                          static_cast<T*>(out));
  });
  finish("gather_rows");
}

void scatter_add_rows(DType dtype, void* dst, const std::int64_t* rows, const std::int64_t* offsets,
                      const std::int64_t* positions, std::int64_t distinct, std::int64_t dim, const void* src) {
  dispatch_floating(dtype, "scatter_add_rows", [&](auto tag) {
    using T = decltype(tag);
    scatter_add_rows_kernel<<<blocks_for(distinct * dim), kThreads>>>(static_cast<T*>(dst), rows, offsets, positions,
                                                                      distinct, dim, static_cast<const T*>(src));
  });
  finish("scatter_add_rows");
}

void activation_grad(detail::ActivationGrad op, DType dtype, const void* saved, const void* grad, void* out,
                     std::int64_t n) {
  dispatch_floating(dtype, "activation gradient", [&](auto tag) {
    using T = decltype(tag);
    map2(ActivationGrad<T>{op}, static_cast<const T*>(saved), static_cast<const T*>(grad), static_cast<T*>(out), n);
  });
  finish("activation gradient");
}

void cross_entropy_rows(DType dtype, const void* logits, const std::int64_t* target, std::int64_t rows,
                        std::int64_t classes, std::int64_t ignore_index, double eps, double* log_sum_exp,
                        double* row_loss) {
  dispatch_floating(dtype, "cross entropy", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_rows_kernel<<<static_cast<unsigned>(rows), kRowThreads>>>(
        static_cast<const T*>(logits), target, classes, ignore_index, eps, log_sum_exp, row_loss);
  });
  finish("cross entropy");
}

void cross_entropy_grad(DType dtype, const void* logits, const std::int64_t* target, const double* log_sum_exp,
                        std::int64_t rows, std::int64_t classes, std::int64_t ignore_index, double eps, double factor,
                        void* grad) {
  dispatch_floating(dtype, "cross entropy gradient", [&](auto tag) {
    using T = decltype(tag);
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(rows, std::int64_t{1} << 20));
    cross_entropy_grad_kernel<<<blocks, kRowThreads>>>(static_cast<const T*>(logits), target, log_sum_exp, rows,
                                                       classes, ignore_index, eps, factor, static_cast<T*>(grad));
  });
  finish("cross entropy gradient");
}

}  // namespace troupe::tensor::cuda_backend
