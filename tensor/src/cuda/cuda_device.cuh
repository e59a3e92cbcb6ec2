// Device-side helpers shared by the .cu files of the tensor module: the launch shape,
// the compute type of each element type and the conversion that stores a result.
// Every kernel is one grid-stride loop (TROUPE_GRID_LOOP), so any n runs on a grid
// capped at kMaxBlocks.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda_backend.hpp"
#include "cuda_check.hpp"

namespace troupe::tensor::cuda_backend {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 65535 * 32;

inline int blocks_for(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

#define TROUPE_GRID_LOOP(i, n)                                                        \
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::int64_t{gridDim.x} * blockDim.x)

// f16/bf16 compute in float; u8 in int, so that its arithmetic wraps as on the host
// (where u8 promotes to int) instead of converting a negative float to u8.
template <class T>
__device__ inline float to_compute(T x) {
  return static_cast<float>(x);
}
__device__ inline float to_compute(float x) { return x; }
__device__ inline double to_compute(double x) { return x; }
__device__ inline std::int64_t to_compute(std::int64_t x) { return x; }
__device__ inline std::int32_t to_compute(std::int32_t x) { return x; }
__device__ inline std::int32_t to_compute(std::uint8_t x) { return x; }

// A floating value goes to u8 through i64 and wraps, as on the host (convert.hpp):
// a plain float -> u8 conversion is undefined out of range, and the GPU saturates.
template <class D, class S>
__device__ inline D convert_to(S x) {
  if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)
    return D(static_cast<float>(x));
  else if constexpr (std::is_same_v<D, std::uint8_t> && !std::is_integral_v<S>)
    return static_cast<D>(static_cast<std::int64_t>(to_compute(x)));
  else
    return static_cast<D>(to_compute(x));
}

__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// E elements of T moved as one access. A thread that moves 2 bytes at a time keeps too
// few bytes in flight to fill the memory's bandwidth (bf16 elementwise kernels ran at
// a quarter of it); the elementwise kernels below move 16 bytes per access instead.
template <class T, int E>
struct alignas(sizeof(T) * E) Pack {
  T v[E];
};

// Elements per access of a kernel reading I and writing O: 16 bytes of the wider.
template <class O, class I>
constexpr int kPackOf = 16 / static_cast<int>(sizeof(O) > sizeof(I) ? sizeof(O) : sizeof(I));

// out[i] = f(in[i]) for i < n, E elements per access, then the tail one at a time.
template <int E, class O, class I, class F>
__global__ void map_kernel(F f, const I* in, O* out, std::int64_t n) {
  const std::int64_t packs = n / E;
  TROUPE_GRID_LOOP(p, packs) {
    const Pack<I, E> x = reinterpret_cast<const Pack<I, E>*>(in)[p];
    Pack<O, E> y;
#pragma unroll
    for (int j = 0; j < E; ++j) y.v[j] = f(x.v[j]);
    reinterpret_cast<Pack<O, E>*>(out)[p] = y;
  }
  TROUPE_GRID_LOOP(i, n - packs * E) out[packs * E + i] = f(in[packs * E + i]);
}

// out[i] = f(a[i], b[i]) likewise.
template <int E, class T, class F>
__global__ void map2_kernel(F f, const T* a, const T* b, T* out, std::int64_t n) {
  const std::int64_t packs = n / E;
  TROUPE_GRID_LOOP(p, packs) {
    const Pack<T, E> x = reinterpret_cast<const Pack<T, E>*>(a)[p];
    const Pack<T, E> y = reinterpret_cast<const Pack<T, E>*>(b)[p];
    Pack<T, E> z;
#pragma unroll
    for (int j = 0; j < E; ++j) z.v[j] = f(x.v[j], y.v[j]);
    reinterpret_cast<Pack<T, E>*>(out)[p] = z;
  }
  TROUPE_GRID_LOOP(i, n - packs * E) out[packs * E + i] = f(a[packs * E + i], b[packs * E + i]);
}

// Launches map_kernel, packed where every pointer is 16-byte aligned (any tensor the
// allocator made; a view at an odd offset goes element by element). in may equal out.
template <class O, class I, class F>
void map(F f, const I* in, O* out, std::int64_t n) {
  constexpr int E = kPackOf<O, I>;
  if (aligned16(in) && aligned16(out))
    map_kernel<E><<<blocks_for(n / E + 1), kThreads>>>(f, in, out, n);
  else
    map_kernel<1><<<blocks_for(n), kThreads>>>(f, in, out, n);
}

template <class T, class F>
void map2(F f, const T* a, const T* b, T* out, std::int64_t n) {
  constexpr int E = kPackOf<T, T>;
  if (aligned16(a) && aligned16(b) && aligned16(out))
    map2_kernel<E><<<blocks_for(n / E + 1), kThreads>>>(f, a, b, out, n);
  else
    map2_kernel<1><<<blocks_for(n), kThreads>>>(f, a, b, out, n);
}

// Launches queue on the legacy default stream and return at once, as PyTorch's do:
// kernels run in launch order, and the host waits only where it reads device memory
// (a copy to the host, item()) or calls cuda_synchronize(). A bad launch is reported
// here; a fault inside a kernel surfaces at the next synchronising call, so
// CUDA_LAUNCH_BLOCKING=1 is the way to pin one to the call that caused it.
inline void finish(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) cuda_check(status, what, __FILE__, __LINE__);
}

}  // namespace troupe::tensor::cuda_backend
