// Kernels of nn's layers and losses: activation gradients (nn_math.hpp's formulas, as
// the host runs them), softmax cross-entropy and LayerNorm (a block per row, LayerNorm
// in double as the host loop), and Embedding's row gather and in-order scatter-add.
#include <algorithm>

#include <cub/block/block_reduce.cuh>

#include "cuda_device.cuh"

namespace troupe::tensor::cuda_backend {

namespace {

template <class T>
__global__ void activation_grad_kernel(detail::ActivationGrad op, const T* saved, const T* gy, T* out,
                                       std::int64_t n) {
  TROUPE_GRID_LOOP(i, n) out[i] = convert_to<T>(detail::activation_grad(op, to_compute(saved[i]), to_compute(gy[i])));
}

// f64 logits in double, the others in float; the row's results are kept in double.
template <class T> using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__global__ void cross_entropy_rows_kernel(const T* logits, const std::int64_t* target, std::int64_t classes,
                                          std::int64_t ignore_index, double eps, double* lse_out,
                                          double* row_loss) {
  using C = Acc<T>;
  using Reduce = cub::BlockReduce<C, kThreads>;
  __shared__ typename Reduce::TempStorage scratch;
  __shared__ C row_max;
  const std::int64_t r = blockIdx.x;
  const std::int64_t y = target[r];
  if (y == ignore_index) {  // the same branch for the whole block
    if (threadIdx.x == 0) lse_out[r] = row_loss[r] = 0;
    return;
  }
  const T* row = logits + r * classes;
  C m = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) m = fmax(m, static_cast<C>(to_compute(row[c])));
  const C block_max = Reduce(scratch).Reduce(m, [](C a, C b) { return a > b ? a : b; });
  if (threadIdx.x == 0) row_max = block_max;
  __syncthreads();
  m = row_max;
  C sum_exp = 0, sum_logits = 0;
  for (std::int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const C v = to_compute(row[c]);
    sum_exp += exp(v - m);
    sum_logits += v;
  }
  const C total_exp = Reduce(scratch).Sum(sum_exp);
  __syncthreads();  // the scratch is reused
  const C total_logits = Reduce(scratch).Sum(sum_logits);
  if (threadIdx.x == 0) {
    const double lse = static_cast<double>(m) + log(static_cast<double>(total_exp));
    const double n = static_cast<double>(classes);
    lse_out[r] = lse;
    const double nll = lse - static_cast<double>(to_compute(row[y]));
    row_loss[r] = (1.0 - eps) * nll + eps / n * (n * lse - static_cast<double>(total_logits));
  }
}

// A thread owns a class and walks the rows: no div/mod per element, and a row's target
// and log-sum-exp are one load shared by the block (GPT-2's 8192 x 50257 logits).
template <class T>
__global__ void cross_entropy_grad_kernel(const T* logits, const std::int64_t* target, const double* lse,
                                          std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                                          double eps, double factor, T* grad) {
  using C = Acc<T>;
  const C off = static_cast<C>(eps / static_cast<double>(classes));
  const std::int64_t c = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (c >= classes) return;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::int64_t i = r * classes + c;
    const std::int64_t y = target[r];
    if (y == ignore_index) {
      grad[i] = convert_to<T>(C(0));
      continue;
    }
    const C p = exp(static_cast<C>(to_compute(logits[i])) - static_cast<C>(lse[r]));
    const C q = (c == y ? static_cast<C>(1.0 - eps) : C(0)) + off;
    grad[i] = convert_to<T>((p - q) * static_cast<C>(factor));
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

// LayerNorm: a block per row; the statistics in double, as the host loop computes them.
using RowReduce = cub::BlockReduce<double, kThreads>;

template <class T>
__global__ void layer_norm_forward_kernel(const T* x, const T* w, const T* b, std::int64_t n, double eps, T* y,
                                          double* mean_out, double* rstd_out) {
  __shared__ typename RowReduce::TempStorage scratch;
  __shared__ double row_mean, row_rstd;
  const std::int64_t r = blockIdx.x;
  const T* xr = x + r * n;
  double sum = 0;
  for (std::int64_t c = threadIdx.x; c < n; c += blockDim.x) sum += static_cast<double>(to_compute(xr[c]));
  const double total = RowReduce(scratch).Sum(sum);
  if (threadIdx.x == 0) row_mean = total / static_cast<double>(n);
  __syncthreads();  // also between the two uses of the scratch
  const double mean = row_mean;
  double var = 0;  // two passes: no cancellation when |mean| >> std
  for (std::int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    const double d = static_cast<double>(to_compute(xr[c])) - mean;
    var += d * d;
  }
  const double total_var = RowReduce(scratch).Sum(var);
  if (threadIdx.x == 0) {
    row_rstd = 1.0 / ::sqrt(total_var / static_cast<double>(n) + eps);
    mean_out[r] = mean;
    rstd_out[r] = row_rstd;
  }
  __syncthreads();
  const double rstd = row_rstd;
  T* yr = y + r * n;
  for (std::int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    double v = (static_cast<double>(to_compute(xr[c])) - mean) * rstd;
    if (w) v = v * static_cast<double>(to_compute(w[c])) + static_cast<double>(to_compute(b[c]));
    yr[c] = convert_to<T>(v);
  }
}

template <class T>
__global__ void layer_norm_backward_kernel(const T* x, const T* gy, const T* w, const double* mean,
                                           const double* rstd, std::int64_t n, T* gx) {
  __shared__ typename RowReduce::TempStorage scratch;
  __shared__ double row_dnorm, row_dnorm_xhat;
  const std::int64_t r = blockIdx.x;
  const T* xr = x + r * n;
  const T* gr = gy + r * n;
  const double m = mean[r], rs = rstd[r];
  const auto dnorm_at = [&](std::int64_t c) {
    const double g = static_cast<double>(to_compute(gr[c]));
    return w ? g * static_cast<double>(to_compute(w[c])) : g;
  };
  double s1 = 0, s2 = 0;
  for (std::int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    const double dn = dnorm_at(c);
    s1 += dn;
    s2 += dn * ((static_cast<double>(to_compute(xr[c])) - m) * rs);
  }
  const double total1 = RowReduce(scratch).Sum(s1);
  __syncthreads();
  const double total2 = RowReduce(scratch).Sum(s2);
  if (threadIdx.x == 0) {
    row_dnorm = total1 / static_cast<double>(n);
    row_dnorm_xhat = total2 / static_cast<double>(n);
  }
  __syncthreads();
  T* gxr = gx + r * n;
  for (std::int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    const double xhat = (static_cast<double>(to_compute(xr[c])) - m) * rs;
    gxr[c] = convert_to<T>(rs * (dnorm_at(c) - row_dnorm - xhat * row_dnorm_xhat));
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
    layer_norm_forward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), n, eps,
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
    layer_norm_backward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(xt, gyt, static_cast<const T*>(weight),
                                                                           mean, rstd, n, static_cast<T*>(gx));
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
    layer_norm_param_finish_kernel<<<blocks_for(n), kThreads>>>(scratch, scratch + n * parts, n, parts,
                                                                static_cast<T*>(grad_weight),
                                                                static_cast<T*>(grad_bias));
    release(scratch, device);  // the caching allocator's blocks are reused in stream order
    finish("layer_norm parameter gradients");
  });
}

void gather_rows(DType dtype, const void* table, const std::int64_t* idx, std::int64_t n, std::int64_t dim,
                 void* out) {
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
    activation_grad_kernel<<<blocks_for(n), kThreads>>>(op, static_cast<const T*>(saved),
                                                        static_cast<const T*>(grad), static_cast<T*>(out), n);
  });
  finish("activation gradient");
}

void cross_entropy_rows(DType dtype, const void* logits, const std::int64_t* target, std::int64_t rows,
                        std::int64_t classes, std::int64_t ignore_index, double eps, double* log_sum_exp,
                        double* row_loss) {
  dispatch_floating(dtype, "cross entropy", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_rows_kernel<<<static_cast<unsigned>(rows), kThreads>>>(
        static_cast<const T*>(logits), target, classes, ignore_index, eps, log_sum_exp, row_loss);
  });
  finish("cross entropy");
}

void cross_entropy_grad(DType dtype, const void* logits, const std::int64_t* target, const double* log_sum_exp,
                        std::int64_t rows, std::int64_t classes, std::int64_t ignore_index, double eps,
                        double factor, void* grad) {
  dispatch_floating(dtype, "cross entropy gradient", [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>((classes + kThreads - 1) / kThreads),
                    static_cast<unsigned>(rows < 65535 ? rows : 65535));
    cross_entropy_grad_kernel<<<grid, kThreads>>>(
        static_cast<const T*>(logits), target, log_sum_exp, rows, classes, ignore_index, eps, factor,
        static_cast<T*>(grad));
  });
  finish("cross entropy gradient");
}

}  // namespace troupe::tensor::cuda_backend
