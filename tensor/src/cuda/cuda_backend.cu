// CUDA kernels of the tensor module: fill, casts, elementwise arithmetic, comparisons
// and math (broadcasting), reductions, and counter-based random draws (copies between
// host and device are cuda_memory.cpp's). Element conversions and Philox are the
// host's own functions (half.hpp, philox.hpp) compiled for the device, which is what
// makes a cast or a random tensor bit-identical on CPU and GPU.
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

// The per-element functions of the packed elementwise kernels (cuda_device.cuh's map).
template <class D> struct CastTo {
  template <class S> __device__ D operator()(S x) const { return convert_to<D>(x); }
};

template <class T> struct Constant {
  T value;
  __device__ T operator()(T) const { return value; }
};

template <class T>
__global__ void fill_kernel(T* out, T value, std::int64_t n) {
  constexpr int E = kPackOf<T, T>;
  Pack<T, E> pack;
#pragma unroll
  for (int j = 0; j < E; ++j) pack.v[j] = value;
  const std::int64_t packs = n / E;
  TROUPE_GRID_LOOP(p, packs) reinterpret_cast<Pack<T, E>*>(out)[p] = pack;
  TROUPE_GRID_LOOP(i, n - packs * E) out[packs * E + i] = value;
}

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

// Stores x op y at out[i]: in T for arithmetic, as u8 0/1 for comparisons.
template <class T, class C>
__device__ inline void store_binary(BinaryOp op, C x, C y, void* out, std::int64_t i) {
  bool flag = false;
  switch (op) {
    case BinaryOp::add: static_cast<T*>(out)[i] = convert_to<T>(x + y); return;
    case BinaryOp::sub: static_cast<T*>(out)[i] = convert_to<T>(x - y); return;
    case BinaryOp::mul: static_cast<T*>(out)[i] = convert_to<T>(x * y); return;
    case BinaryOp::div: static_cast<T*>(out)[i] = convert_to<T>(x / y); return;
    case BinaryOp::eq: flag = x == y; break;
    case BinaryOp::ne: flag = x != y; break;
    case BinaryOp::lt: flag = x < y; break;
    case BinaryOp::le: flag = x <= y; break;
    case BinaryOp::gt: flag = x > y; break;
    case BinaryOp::ge: flag = x >= y; break;
  }
  static_cast<std::uint8_t*>(out)[i] = flag ? 1 : 0;
}

template <class T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, bool b_scalar, void* out, std::int64_t n) {
  TROUPE_GRID_LOOP(i, n) store_binary<T>(op, to_compute(a[i]), to_compute(b[b_scalar ? 0 : i]), out, i);
}

bool is_arithmetic(BinaryOp op) {
  return op == BinaryOp::add || op == BinaryOp::sub || op == BinaryOp::mul || op == BinaryOp::div;
}

// x op y in T for the four arithmetic ops: store_binary's arithmetic, returned.
template <class T> struct Arithmetic {
  BinaryOp op;
  __device__ T operator()(T a, T b) const {
    const auto x = to_compute(a), y = to_compute(b);
    switch (op) {
      case BinaryOp::add: return convert_to<T>(x + y);
      case BinaryOp::sub: return convert_to<T>(x - y);
      case BinaryOp::mul: return convert_to<T>(x * y);
      default: return convert_to<T>(x / y);
    }
  }
};

// x op b[0]: the scalar is read where it lives, on the device.
template <class T> struct ArithmeticWithScalar {
  Arithmetic<T> f;
  const T* b;
  __device__ T operator()(T a) const { return f(a, *b); }
};

// The general broadcast: element i's index in each operand from the output's
// coordinates, innermost dimension first (a div/mod per dimension; the same-shape and
// scalar cases take binary_kernel instead).
template <class T>
__global__ void broadcast_kernel(BinaryOp op, const T* a, const T* b, BroadcastIndex index, void* out,
                                 std::int64_t n) {
  TROUPE_GRID_LOOP(i, n) {
    std::int64_t rest = i, ia = 0, ib = 0;
    for (int d = index.nd - 1; d >= 0; --d) {
      const std::int64_t coordinate = rest % index.out_shape[d];
      rest /= index.out_shape[d];
      ia += coordinate * index.a_strides[d];
      ib += coordinate * index.b_strides[d];
    }
    store_binary<T>(op, to_compute(a[ia]), to_compute(b[ib]), out, i);
  }
}

// The commonest broadcast, a bias: b is one row of `cols` repeated over the `rows` rows
// of a contiguous a. A thread owns a column and walks rows, so no element pays the
// general kernel's div/mod per dimension (a GPT's bias adds ran at a fraction of the
// memory's rate). Same arithmetic per element as broadcast_kernel.
template <class T>
__global__ void broadcast_row_kernel(BinaryOp op, const T* a, const T* b, std::int64_t rows, std::int64_t cols,
                                     void* out) {
  const std::int64_t col = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (col >= cols) return;
  const auto y = to_compute(b[col]);
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::int64_t i = r * cols + col;
    store_binary<T>(op, to_compute(a[i]), y, out, i);
  }
}

// The same for arithmetic, E columns per access: the column's offset costs one div/mod
// per pack, and a [8192, 2304] bf16 bias add moves 16 bytes per access, not 2.
template <int E, class T>
__global__ void broadcast_row_packed_kernel(Arithmetic<T> f, const T* a, const T* b, std::int64_t rows,
                                            std::int64_t cols, T* out) {
  const std::int64_t row_packs = cols / E;
  TROUPE_GRID_LOOP(p, rows * row_packs) {
    const Pack<T, E> x = reinterpret_cast<const Pack<T, E>*>(a)[p];
    const Pack<T, E> y = reinterpret_cast<const Pack<T, E>*>(b)[p % row_packs];
    Pack<T, E> z;
#pragma unroll
    for (int j = 0; j < E; ++j) z.v[j] = f(x.v[j], y.v[j]);
    reinterpret_cast<Pack<T, E>*>(out)[p] = z;
  }
}

// Whether `index` is a contiguous a with b one row along the last dimension.
bool is_row_broadcast(const BroadcastIndex& index) {
  if (index.nd < 2 || index.a_strides[index.nd - 1] != 1 || index.b_strides[index.nd - 1] != 1) return false;
  std::int64_t stride = index.out_shape[index.nd - 1];
  for (int d = index.nd - 2; d >= 0; --d) {
    if (index.a_strides[d] != stride || index.b_strides[d] != 0) return false;
    stride *= index.out_shape[d];
  }
  return true;
}

// The same formulas as the host (elementwise.cpp, nn/src/activation.cpp), in the
// compute type; CUDA's float overloads of the math functions keep f32 in f32.
template <class C>
__device__ inline C apply_unary(UnaryOp op, C x, double lo, double hi) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::abs: return x < C(0) ? -x : x;
    case UnaryOp::relu: return x > C(0) ? x : C(0);
    case UnaryOp::clamp: return x < static_cast<C>(lo) ? static_cast<C>(lo) : (x > static_cast<C>(hi) ? static_cast<C>(hi) : x);
    default: break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    constexpr C kInvSqrt2 = C(0.7071067811865476), kSqrt2OverPi = C(0.7978845608028654), kCubic = C(0.044715);
    switch (op) {
      case UnaryOp::sqrt: return ::sqrt(x);
      case UnaryOp::exp: return ::exp(x);
      case UnaryOp::log: return ::log(x);
      case UnaryOp::tanh: return ::tanh(x);
      case UnaryOp::sigmoid: return C(1) / (C(1) + ::exp(-x));
      case UnaryOp::gelu: return C(0.5) * x * (C(1) + ::erf(x * kInvSqrt2));
      case UnaryOp::gelu_tanh: return C(0.5) * x * (C(1) + ::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
      default: break;
    }
  }
  return x;  // unreachable: the host lets only floating dtypes reach the math ops
}

template <class T> struct Unary {
  UnaryOp op;
  double lo, hi;
  __device__ T operator()(T x) const { return convert_to<T>(apply_unary(op, to_compute(x), lo, hi)); }
};

// y + alpha * x, and x * alpha, in the compute type.
template <class T> struct Axpy {
  double alpha;
  __device__ T operator()(T y, T x) const {
    using C = decltype(to_compute(y));
    return convert_to<T>(to_compute(y) + static_cast<C>(alpha) * to_compute(x));
  }
};

template <class T> struct Scale {
  double alpha;
  __device__ T operator()(T x) const {
    using C = decltype(to_compute(x));
    return convert_to<T>(to_compute(x) * static_cast<C>(alpha));
  }
};

template <class T>
__global__ void random_kernel(bool normal, T* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                              double a, double b) {
  TROUPE_GRID_LOOP(i, n) {
    const auto k = static_cast<std::uint64_t>(i);
    const double v = normal ? a + b * detail::philox_normal(seed, offset, k)
                            : a + (b - a) * detail::philox_uniform(seed, offset, k);
    out[i] = convert_to<T>(v);
  }
}

// ---- reductions ----
// The input is [outer, n, inner]. Each thread folds elements into a Partial (running
// value plus the index that produced it, -1 while empty); partials are combined in any
// order, so ties and NaNs are settled by index: the first NaN wins max/min/argmax and
// the first of equal maxima wins argmax, as on the host.
template <class T> struct AccumulatorOf { using type = double; };
template <> struct AccumulatorOf<Half> { using type = float; };
template <> struct AccumulatorOf<BFloat16> { using type = float; };
template <> struct AccumulatorOf<std::int32_t> { using type = std::int64_t; };
template <> struct AccumulatorOf<std::int64_t> { using type = std::int64_t; };
template <> struct AccumulatorOf<std::uint8_t> { using type = std::int64_t; };

template <class A> struct Partial {
  A value;
  std::int64_t index;
};

template <class A> __device__ inline bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return v != v;
  else return false;
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

void fill(void* data, DType dtype, std::int64_t n, double value) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v = T(static_cast<float>(value));
    else v = static_cast<T>(value);
    if (aligned16(data)) fill_kernel<<<blocks_for(n / kPackOf<T, T> + 1), kThreads>>>(static_cast<T*>(data), v, n);
    else map(Constant<T>{v}, static_cast<const T*>(data), static_cast<T*>(data), n);
  });
  finish("fill");
}

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n) {
  dispatch(src_dtype, [&](auto s) {
    dispatch(dst_dtype, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      map(CastTo<D>{}, static_cast<const S*>(src), static_cast<D*>(dst), n);
    });
  });
  finish("cast");
}

void binary(BinaryOp op, DType dtype, const void* a, const void* b, bool b_is_scalar, void* out, std::int64_t n) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(a);
    const auto* y = static_cast<const T*>(b);
    if (!is_arithmetic(op)) binary_kernel<<<blocks_for(n), kThreads>>>(op, x, y, b_is_scalar, out, n);
    else if (b_is_scalar) map(ArithmeticWithScalar<T>{{op}, y}, x, static_cast<T*>(out), n);
    else map2(Arithmetic<T>{op}, x, y, static_cast<T*>(out), n);
  });
  finish("binary op");
}

void binary_broadcast(BinaryOp op, DType dtype, const void* a, const void* b, const BroadcastIndex& index,
                      void* out, std::int64_t n) {
  const std::int64_t cols = index.nd > 0 ? index.out_shape[index.nd - 1] : 1;
  const bool rows_of_b = n > 0 && cols > 0 && is_row_broadcast(index);
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int E = kPackOf<T, T>;
    if (rows_of_b && is_arithmetic(op) && cols % E == 0 && aligned16(a) && aligned16(b) && aligned16(out)) {
      const std::int64_t rows = n / cols;
      broadcast_row_packed_kernel<E><<<blocks_for(n / E), kThreads>>>(
          Arithmetic<T>{op}, static_cast<const T*>(a), static_cast<const T*>(b), rows, cols, static_cast<T*>(out));
    } else if (rows_of_b) {
      const std::int64_t rows = n / cols;
      const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                      static_cast<unsigned>(rows < 65535 ? rows : 65535));
      broadcast_row_kernel<<<grid, kThreads>>>(op, static_cast<const T*>(a), static_cast<const T*>(b), rows, cols,
                                               out);
    } else {
      broadcast_kernel<<<blocks_for(n), kThreads>>>(op, static_cast<const T*>(a), static_cast<const T*>(b), index,
                                                    out, n);
    }
  });
  finish("broadcast binary op");
}

void unary(UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n, double lo, double hi) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    map(Unary<T>{op, lo, hi}, static_cast<const T*>(in), static_cast<T*>(out), n);
  });
  finish("unary op");
}

void axpy(DType dtype, void* y, double alpha, const void* x, std::int64_t n) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    map2(Axpy<T>{alpha}, static_cast<const T*>(y), static_cast<const T*>(x), static_cast<T*>(y), n);
  });
  finish("axpy");
}

void scale(DType dtype, void* data, double alpha, std::int64_t n) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    map(Scale<T>{alpha}, static_cast<const T*>(data), static_cast<T*>(data), n);
  });
  finish("scale");
}

void reduce(ReduceOp op, DType in_dtype, const void* in, DType out_dtype, void* out, std::int64_t outer,
            std::int64_t n, std::int64_t inner) {
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
    if (out_dtype == DType::i64) launch_finish(static_cast<std::int64_t*>(out));
    else launch_finish(static_cast<T*>(out));
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
