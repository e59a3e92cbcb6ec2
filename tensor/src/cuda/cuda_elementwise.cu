// Elementwise CUDA kernels of the tensor module: fill, casts, arithmetic and
// comparisons (same shape, scalar, broadcast), unary math, axpy and scale. Element
// conversions are the host's own functions (half.hpp) compiled for the device and each
// element's arithmetic is the host loop's, in the same compute type, so a cast or a sum
// gives the same bits on CPU and GPU. Where the pointers allow, the kernels move 16
// bytes per access (cuda_device.cuh's map).
#include "cuda_device.cuh"

namespace troupe::tensor::cuda_backend {

namespace {

// The per-element functions of the packed elementwise kernels (cuda_device.cuh's map).
template <class D>
struct CastTo {
  template <class S>
  __device__ D operator()(S x) const {
    return convert_to<D>(x);
  }
};

template <class T>
struct Constant {
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
template <class T>
struct Arithmetic {
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
template <class T>
struct ArithmeticWithScalar {
  Arithmetic<T> f;
  const T* b;
  __device__ T operator()(T a) const { return f(a, *b); }
};

// The general broadcast: element i's index in each operand from the output's
// coordinates, innermost dimension first (a div/mod per dimension; the same-shape and
// scalar cases take binary_kernel instead).
template <class T>
__global__ void broadcast_kernel(BinaryOp op, const T* a, const T* b, BroadcastIndex index, void* out, std::int64_t n) {
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
    case UnaryOp::clamp:
      return x < static_cast<C>(lo) ? static_cast<C>(lo) : (x > static_cast<C>(hi) ? static_cast<C>(hi) : x);
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

template <class T>
struct Unary {
  UnaryOp op;
  double lo, hi;
  __device__ T operator()(T x) const { return convert_to<T>(apply_unary(op, to_compute(x), lo, hi)); }
};

// y + alpha * x, and x * alpha, in the compute type.
template <class T>
struct Axpy {
  double alpha;
  __device__ T operator()(T y, T x) const {
    using C = decltype(to_compute(y));
    return convert_to<T>(to_compute(y) + static_cast<C>(alpha) * to_compute(x));
  }
};

template <class T>
struct Scale {
  double alpha;
  __device__ T operator()(T x) const {
    using C = decltype(to_compute(x));
    return convert_to<T>(to_compute(x) * static_cast<C>(alpha));
  }
};

}  // namespace

void fill(void* data, DType dtype, std::int64_t n, double value) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      v = T(static_cast<float>(value));
    else
      v = static_cast<T>(value);
    if (aligned16(data))
      fill_kernel<<<blocks_for(n / kPackOf<T, T> + 1), kThreads>>>(static_cast<T*>(data), v, n);
    else
      map(Constant<T>{v}, static_cast<const T*>(data), static_cast<T*>(data), n);
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
    if (!is_arithmetic(op))
      binary_kernel<<<blocks_for(n), kThreads>>>(op, x, y, b_is_scalar, out, n);
    else if (b_is_scalar)
      map(ArithmeticWithScalar<T>{{op}, y}, x, static_cast<T*>(out), n);
    else
      map2(Arithmetic<T>{op}, x, y, static_cast<T*>(out), n);
  });
  finish("binary op");
}

void binary_broadcast(BinaryOp op, DType dtype, const void* a, const void* b, const BroadcastIndex& index, void* out,
                      std::int64_t n) {
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
      broadcast_row_kernel<<<grid, kThreads>>>(op, static_cast<const T*>(a), static_cast<const T*>(b), rows, cols, out);
    } else {
      broadcast_kernel<<<blocks_for(n), kThreads>>>(op, static_cast<const T*>(a), static_cast<const T*>(b), index, out,
                                                    n);
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

}  // namespace troupe::tensor::cuda_backend
