// CUDA kernels of the tensor module other than the elementwise ones
// (cuda_elementwise.cu): the device, padded row copies, reductions and counter-based
// random draws (copies between host and device are cuda_memory.cpp's). Philox is the
// host's own function (philox.hpp) compiled for the device, which is what makes a
// random tensor bit-identical on CPU and GPU.
//
// Kernels queue on the legacy default stream and return without waiting
// (cuda_device.cuh's finish()); copies to the host and cuda_synchronize() wait.
// NCCL runs on streams of its own, ordered after these kernels by events
// (collectives/src/nccl_communicator.cpp).

#include <algorithm>

#include "../philox.hpp"
#include "cuda_device.cuh"

namespace troupe::tensor::cuda_backend {

namespace {

// A row's columns in runs of kCopyRun per thread, each load and store coalesced across
// the warp: eight 2-byte accesses in flight per thread (one would leave the memory
// mostly idle), without the 16-byte alignment a packed access needs (the source rows of
// GPT-2's logits are 50257 elements apart). Cells of dst outside src get zeros.
constexpr int kCopyRun = 8;

__global__ void copy_rows_2byte_kernel(const std::uint16_t* src, std::int64_t src_ld, std::int64_t rows,
                                       std::int64_t cols, std::uint16_t* dst, std::int64_t dst_ld,
                                       std::int64_t dst_rows, std::int64_t dst_cols) {
  const std::int64_t first = blockIdx.x * std::int64_t{blockDim.x} * kCopyRun + threadIdx.x;
  for (std::int64_t r = blockIdx.y; r < dst_rows; r += gridDim.y) {
    const std::uint16_t* s = src + r * src_ld;
    std::uint16_t* d = dst + r * dst_ld;
    std::uint16_t v[kCopyRun];
#pragma unroll
    for (int j = 0; j < kCopyRun; ++j) {
      const std::int64_t c = first + j * std::int64_t{blockDim.x};
      v[j] = r < rows && c < cols ? s[c] : std::uint16_t{0};
    }
#pragma unroll
    for (int j = 0; j < kCopyRun; ++j) {
      const std::int64_t c = first + j * std::int64_t{blockDim.x};
      if (c < dst_cols) d[c] = v[j];
    }
  }
}

template <class T>
__global__ void random_kernel(bool normal, T* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double a,
                              double b) {
  TROUPE_GRID_LOOP(i, n) {
    const auto k = static_cast<std::uint64_t>(i);
    const double v =
        normal ? a + b * detail::philox_normal(seed, offset, k) : a + (b - a) * detail::philox_uniform(seed, offset, k);
    out[i] = convert_to<T>(v);
  }
}

// ---- reductions ----
// The input is [outer, n, inner]. Each thread folds elements into a Partial (running
// value plus the index that produced it, -1 while empty); partials are combined in any
// order, so ties and NaNs are settled by index: the first NaN wins max/min/argmax and
// the first of equal maxima wins argmax, as on the host.
template <class T>
struct AccumulatorOf {
  using type = double;
};
template <>
struct AccumulatorOf<Half> {
  using type = float;
};
template <>
struct AccumulatorOf<BFloat16> {
  using type = float;
};
template <>
struct AccumulatorOf<std::int32_t> {
  using type = std::int64_t;
};
template <>
struct AccumulatorOf<std::int64_t> {
  using type = std::int64_t;
};
template <>
struct AccumulatorOf<std::uint8_t> {
  using type = std::int64_t;
};

template <class A>
struct Partial {
  A value;
  std::int64_t index;
};

template <class A>
__device__ inline bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>)
    return v != v;
  else
    return false;
}

template <class A>
__device__ inline Partial<A> combine(ReduceOp op, Partial<A> x, Partial<A> y) {
  if (y.index < 0) return x;
  if (x.index < 0) return y;
  if (op == ReduceOp::sum || op == ReduceOp::mean || op == ReduceOp::norm)
    return {x.value + y.value, x.index < y.index ? x.index : y.index};
  const bool x_nan = is_nan(x.value), y_nan = is_nan(y.value);
  if (x_nan || y_nan) return x_nan && (!y_nan || x.index < y.index) ? x : y;
  const bool y_better = op == ReduceOp::min ? y.value < x.value : y.value > x.value;
  return y_better || (y.value == x.value && y.index < x.index) ? y : x;
}

template <class A, class T>
__device__ inline Partial<A> element(ReduceOp op, T x, std::int64_t k) {
  const A v = static_cast<A>(to_compute(x));
  return {op == ReduceOp::norm ? v * v : v, k};
}

// inner == 1: block `task` folds part (task % parts) of row (task / parts) and writes
// one partial; a row split into several parts keeps every SM busy when rows are few
// (a whole-tensor sum is one row).
template <class T, class A>
__global__ void reduce_rows_kernel(ReduceOp op, const T* in, std::int64_t rows, std::int64_t n, std::int64_t parts,
                                   Partial<A>* partials) {
  __shared__ Partial<A> shared[kThreads];
  const std::int64_t chunk = (n + parts - 1) / parts;
  for (std::int64_t task = blockIdx.x; task < rows * parts; task += gridDim.x) {
    const std::int64_t row = task / parts, begin = (task % parts) * chunk;
    const std::int64_t end = begin + chunk < n ? begin + chunk : n;
    Partial<A> acc{A{}, -1};
    for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x)
      acc = combine(op, acc, element<A>(op, in[row * n + k], k));
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) shared[threadIdx.x] = combine(op, shared[threadIdx.x], shared[threadIdx.x + stride]);
      __syncthreads();
    }
    if (threadIdx.x == 0) partials[task] = shared[0];
    __syncthreads();
  }
}

// inner > 1: thread (p, o) walks part p of output o's column k = [p * chunk, ...);
// neighbouring threads take neighbouring outputs, so the loads coalesce. Splitting
// the columns into parts keeps the GPU busy when outputs are few (a bias gradient
// sums 8192 rows into 768 outputs: one thread per output was 3 blocks).
template <class T, class A>
__global__ void reduce_columns_kernel(ReduceOp op, const T* in, std::int64_t outer, std::int64_t n, std::int64_t inner,
                                      std::int64_t parts, Partial<A>* partials) {
  const std::int64_t outputs = outer * inner, chunk = (n + parts - 1) / parts;
  TROUPE_GRID_LOOP(t, outputs * parts) {
    const std::int64_t o = t % outputs, p = t / outputs;
    const T* column = in + (o / inner) * n * inner + o % inner;
    const std::int64_t begin = p * chunk, end = begin + chunk < n ? begin + chunk : n;
    Partial<A> acc{A{}, -1};
    for (std::int64_t k = begin; k < end; ++k) acc = combine(op, acc, element<A>(op, column[k * inner], k));
    partials[o * parts + p] = acc;
  }
}

template <class A, class O>
__global__ void reduce_finish_kernel(ReduceOp op, const Partial<A>* partials, std::int64_t parts, std::int64_t outputs,
                                     std::int64_t n, O* out) {
  TROUPE_GRID_LOOP(o, outputs) {
    Partial<A> acc{A{}, -1};
    for (std::int64_t p = 0; p < parts; ++p) acc = combine(op, acc, partials[o * parts + p]);
    switch (op) {
      case ReduceOp::mean: out[o] = convert_to<O>(static_cast<double>(acc.value) / static_cast<double>(n)); break;
      case ReduceOp::norm: out[o] = convert_to<O>(::sqrt(static_cast<double>(acc.value))); break;
      case ReduceOp::argmax: out[o] = convert_to<O>(acc.index); break;
      default: out[o] = convert_to<O>(acc.value); break;
    }
  }
}

}  // namespace

int device_count() {
  int count = 0;
  // No driver or no device is a normal answer here: the CPU build path goes on.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void synchronize() { TROUPE_CUDA_CHECK(cudaDeviceSynchronize()); }

void* event_record() {
  cudaEvent_t event = nullptr;
  TROUPE_CUDA_CHECK(cudaEventCreate(&event));
  TROUPE_CUDA_CHECK(cudaEventRecord(event, nullptr));  // the legacy default stream, where troupe's kernels run
  return event;
}

double event_elapsed_ms(void* from, void* to) {
  TROUPE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(to)));
  float ms = 0;
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from), static_cast<cudaEvent_t>(to)));
  return ms;
}

void event_destroy(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

void set_device(int device) { TROUPE_CUDA_CHECK(cudaSetDevice(device)); }

void copy_rows_2byte(const void* src, std::int64_t src_ld, std::int64_t rows, std::int64_t cols, void* dst,
                     std::int64_t dst_ld, std::int64_t dst_rows, std::int64_t dst_cols) {
  if (dst_rows == 0 || dst_cols == 0) return;
  const dim3 grid(static_cast<unsigned>((dst_cols + kThreads * kCopyRun - 1) / (kThreads * kCopyRun)),
                  static_cast<unsigned>(dst_rows < 65535 ? dst_rows : 65535));
  copy_rows_2byte_kernel<<<grid, kThreads>>>(static_cast<const std::uint16_t*>(src), src_ld, rows, cols,
                                             static_cast<std::uint16_t*>(dst), dst_ld, dst_rows, dst_cols);
  finish("copy_rows_2byte");
}

void reduce(ReduceOp op, DType in_dtype, const void* in, DType out_dtype, void* out, std::int64_t outer, std::int64_t n,
            std::int64_t inner) {
  const std::int64_t outputs = outer * inner;
  if (outputs == 0) return;
  // Rows split into parts of >= 8192 elements until about 2048 blocks are in flight;
  // columns into parts of >= 64 elements until about 2048 blocks of threads are.
  const std::int64_t parts =
      inner == 1 ? std::max<std::int64_t>(1, std::min<std::int64_t>((n + 8191) / 8192, 2048 / outer))
                 : std::max<std::int64_t>(1, std::min<std::int64_t>((n + 63) / 64, 2048 * kThreads / outputs));
  dispatch(in_dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = typename AccumulatorOf<T>::type;
    const std::size_t scratch_bytes = static_cast<std::size_t>(outputs * parts) * sizeof(Partial<A>);
    int device = 0;
    TROUPE_CUDA_CHECK(cudaGetDevice(&device));
    auto* partials = static_cast<Partial<A>*>(allocate(scratch_bytes, device));
    const T* input = static_cast<const T*>(in);
    if (inner == 1) {
      const int blocks = static_cast<int>(std::min<std::int64_t>(outputs * parts, 65535));
      reduce_rows_kernel<<<blocks, kThreads>>>(op, input, outer, n, parts, partials);
    } else {
      reduce_columns_kernel<<<blocks_for(outputs * parts), kThreads>>>(op, input, outer, n, inner, parts, partials);
    }
    const auto launch_finish = [&](auto* o) {
      reduce_finish_kernel<<<blocks_for(outputs), kThreads>>>(op, partials, parts, outputs, n, o);
    };
    if (out_dtype == DType::i64)
      launch_finish(static_cast<std::int64_t*>(out));
    else
      launch_finish(static_cast<T*>(out));
    try {
      finish("reduce");
    } catch (...) {
      release(partials, device);
      throw;
    }
    release(partials, device);
  });
}

void random_uniform(DType dtype, void* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double lo,
                    double hi) {
  dispatch_floating(dtype, "uniform", [&](auto tag) {
    using T = decltype(tag);
    random_kernel<<<blocks_for(n), kThreads>>>(false, static_cast<T*>(out), n, seed, offset, lo, hi);
  });
  finish("uniform");
}

void random_normal(DType dtype, void* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double mean,
                   double std) {
  dispatch_floating(dtype, "normal", [&](auto tag) {
    using T = decltype(tag);
    random_kernel<<<blocks_for(n), kThreads>>>(true, static_cast<T*>(out), n, seed, offset, mean, std);
  });
  finish("normal");
}

}  // namespace troupe::tensor::cuda_backend
