// Kernels of nn's layers and losses: activation gradients (nn_math.hpp's formulas, as
// the host runs them), softmax cross-entropy (a block per row), and Embedding's row
// gather and in-order scatter-add.
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

template <class T>
__global__ void cross_entropy_grad_kernel(const T* logits, const std::int64_t* target, const double* lse,
                                          std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                                          double eps, double factor, T* grad) {
  using C = Acc<T>;
  const C off = static_cast<C>(eps / static_cast<double>(classes));
  TROUPE_GRID_LOOP(i, rows * classes) {
    const std::int64_t r = i / classes, c = i % classes;
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

}  // namespace

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
    cross_entropy_grad_kernel<<<blocks_for(rows * classes), kThreads>>>(
        static_cast<const T*>(logits), target, log_sum_exp, rows, classes, ignore_index, eps, factor,
        static_cast<T*>(grad));
  });
  finish("cross entropy gradient");
}

}  // namespace troupe::tensor::cuda_backend
