// CUDA kernels of the tensor module: allocation, copies, fill, casts, same-shape
// arithmetic and counter-based random draws. Element conversions and Philox are the
// host's own functions (half.hpp, philox.hpp) compiled for the device, which is what
// makes a cast or a random tensor bit-identical on CPU and GPU.
//
// Kernels run on the default stream and each call synchronises it before returning,
// so a CUDA tensor behaves like a CPU one to its caller. Streams and a caching
// allocator come with the GPU training path.
#include <cstdint>

#include "../philox.hpp"
#include "cuda_backend.hpp"
#include "cuda_check.hpp"

namespace troupe::tensor::cuda_backend {

namespace {

constexpr int kThreads = 256;

int blocks_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 32 ? blocks : 65535 * 32);
}

template <class T> __device__ inline float to_compute(T x) { return static_cast<float>(x); }
__device__ inline double to_compute(double x) { return x; }
__device__ inline std::int64_t to_compute(std::int64_t x) { return x; }
__device__ inline std::int32_t to_compute(std::int32_t x) { return x; }

template <class D, class S> __device__ inline D convert_to(S x) {
  if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) return D(static_cast<float>(x));
  else return static_cast<D>(to_compute(x));
}

template <class S, class D>
__global__ void cast_kernel(const S* in, D* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    out[i] = convert_to<D>(in[i]);
}

template <class T>
__global__ void fill_kernel(T* out, T value, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x)
    out[i] = value;
}

template <class T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, bool b_scalar, T* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    const auto x = to_compute(a[i]);
    const auto y = to_compute(b[b_scalar ? 0 : i]);
    decltype(x + y) r{};
    switch (op) {
      case BinaryOp::add: r = x + y; break;
      case BinaryOp::sub: r = x - y; break;
      case BinaryOp::mul: r = x * y; break;
      case BinaryOp::div: r = x / y; break;
    }
    out[i] = convert_to<T>(r);
  }
}

template <class T>
__global__ void axpy_kernel(T* y, double alpha, const T* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    using C = decltype(to_compute(y[i]));
    y[i] = convert_to<T>(to_compute(y[i]) + static_cast<C>(alpha) * to_compute(x[i]));
  }
}

template <class T>
__global__ void scale_kernel(T* data, double alpha, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    using C = decltype(to_compute(data[i]));
    data[i] = convert_to<T>(to_compute(data[i]) * static_cast<C>(alpha));
  }
}

template <class T>
__global__ void random_kernel(bool normal, T* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset,
                              double a, double b) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    const auto k = static_cast<std::uint64_t>(i);
    const double v = normal ? a + b * detail::philox_normal(seed, offset, k)
                            : a + (b - a) * detail::philox_uniform(seed, offset, k);
    out[i] = convert_to<T>(v);
  }
}

// Launches on the default stream and waits, so errors surface at the call that caused them.
void finish(const char* what) {
  TROUPE_CUDA_CHECK(cudaGetLastError());
  const cudaError_t status = cudaDeviceSynchronize();
  if (status != cudaSuccess) cuda_check(status, what, __FILE__, __LINE__);
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

void* allocate(std::size_t nbytes, int device) {
  TROUPE_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  if (nbytes > 0) TROUPE_CUDA_CHECK(cudaMalloc(&p, nbytes));
  return p;
}

void release(void* data, int device) {
  if (data == nullptr) return;
  cudaSetDevice(device);
  cudaFree(data);  // a destructor must not throw; a failed free at teardown is not actionable
}

void copy(void* dst, const void* src, std::size_t nbytes, CopyKind kind) {
  const cudaMemcpyKind k = kind == CopyKind::host_to_device ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  TROUPE_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, k));
}

void fill(void* data, DType dtype, std::int64_t n, double value) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v = T(static_cast<float>(value));
    else v = static_cast<T>(value);
    fill_kernel<<<blocks_for(n), kThreads>>>(static_cast<T*>(data), v, n);
  });
  finish("fill");
}

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n) {
  dispatch(src_dtype, [&](auto s) {
    dispatch(dst_dtype, [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      cast_kernel<<<blocks_for(n), kThreads>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
    });
  });
  finish("cast");
}

void binary(BinaryOp op, DType dtype, const void* a, const void* b, bool b_is_scalar, void* out, std::int64_t n) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<<<blocks_for(n), kThreads>>>(op, static_cast<const T*>(a), static_cast<const T*>(b), b_is_scalar,
                                               static_cast<T*>(out), n);
  });
  finish("binary op");
}

void axpy(DType dtype, void* y, double alpha, const void* x, std::int64_t n) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    axpy_kernel<<<blocks_for(n), kThreads>>>(static_cast<T*>(y), alpha, static_cast<const T*>(x), n);
  });
  finish("axpy");
}

void scale(DType dtype, void* data, double alpha, std::int64_t n) {
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<<<blocks_for(n), kThreads>>>(static_cast<T*>(data), alpha, n);
  });
  finish("scale");
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
