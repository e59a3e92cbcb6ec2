// What both causal-attention paths on CUDA share: the shape and dropout of one call as
// the kernels read it, the dropout multiplier of a score (the same Philox word the CPU
// draws), and the launch over (batch x head, row tiles).
//   cuda_attention.cu        f64: a thread per row, CUDA cores
//   cuda_attention_mma.cu    bf16: a warp per 16 rows, tensor cores (mma.sync)
//   cuda_attention_tf32.cu   f32: the same layout, each product as three TF32 ones
// The tensor-core kernels also share the pieces below the launch: a block of 4 warps
// owns 64 rows, tiles of 64 rows staged in shared memory, a lane's place in a fragment.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "../philox.hpp"
#include "cuda_device.cuh"

namespace troupe::tensor::cuda_backend::attention {

struct Geometry {
  std::int64_t time, channels, heads, head_dim;
  double scale;  // 1 / sqrt(head_dim)
  double dropout;
  float keep;  // 1 - dropout, as the CPU compares it
  std::uint64_t seed, offset;
};

inline Geometry geometry_of(const AttentionShape& s, const AttentionDropout& drop) {
  return {s.time,  s.channels, s.heads, s.head_dim, 1.0 / std::sqrt(static_cast<double>(s.head_dim)),
          drop.p,  static_cast<float>(1.0 - drop.p), drop.seed, drop.offset};
}

// The dropout multiplier of score (i, j) of head bh: 0 or 1 / keep. Score (i, j) of
// head bh draws Philox word (bh * T + i) * T + j, as the CPU does.
template <class A>
__device__ inline A dropout_factor(const Geometry& g, std::int64_t bh, std::int64_t i, std::int64_t j) {
  const auto index = static_cast<std::uint64_t>((bh * g.time + i) * g.time + j);
  const float u = static_cast<float>(detail::philox_uniform(g.seed, g.offset, index));
  return u < g.keep ? static_cast<A>(1.0 / (1.0 - g.dropout)) : A(0);
}

// Launches `kernel` over (B * H, row tiles of `rows`) with `threads` per block and
// `bytes` of dynamic shared memory, above the 48 KB a launch gets unasked where the
// tiles need it.
template <class Kernel, class... Args>
void launch(Kernel kernel, const AttentionShape& s, int rows, int threads, std::size_t bytes, const char* what,
            Args... args) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
             what, __FILE__, __LINE__);
  const dim3 grid(static_cast<unsigned>(s.batch * s.heads), static_cast<unsigned>((s.time + rows - 1) / rows));
  kernel<<<grid, threads, bytes>>>(args...);
  finish(what);
}

// ---- for the tensor-core kernels ----
constexpr int kTileRows = 64;      // rows per block and per tile, 16 per warp
constexpr int kTileThreads = 128;  // 4 warps

// The lane's place in an mma fragment: row group (0-7) and the lane within it (0-3).
struct Lane {
  int group, pair;
  __device__ Lane() : group((threadIdx.x % 32) / 4), pair(threadIdx.x % 4) {}
};

// Where one head's rows lie: row r's head_dim values start at base + r * stride.
template <class Pointer>
struct Rows {
  Pointer base;
  std::int64_t stride;
};

struct Heads {
  std::int64_t bh, b, h;
  __device__ explicit Heads(const Geometry& g) : bh(blockIdx.x), b(bh / g.heads), h(bh % g.heads) {}
};

// q, k or v (part 0, 1, 2) of head h in batch b of qkv [B, T, 3C] (or of its gradient).
template <class Pointer>
__device__ inline Rows<Pointer> qkv_rows(Pointer qkv, const Geometry& g, const Heads& at, int part) {
  return {qkv + at.b * g.time * 3 * g.channels + part * g.channels + at.h * g.head_dim, 3 * g.channels};
}
// Head h in batch b of a [B, T, C] tensor (out, grad_out).
template <class Pointer>
__device__ inline Rows<Pointer> out_rows(Pointer y, const Geometry& g, const Heads& at) {
  return {y + at.b * g.time * g.channels + at.h * g.head_dim, g.channels};
}

// The 64-row tiles of a sequence of T rows; blocks take them last first, so that the
// longest (the most keys under the mask) start first.
__device__ inline std::int64_t query_tile_first(std::int64_t time) {
  const std::int64_t tiles = (time + kTileRows - 1) / kTileRows;
  return (tiles - 1 - static_cast<std::int64_t>(blockIdx.y)) * kTileRows;
}

// Rows [first, first + 64) of `src` into a tile ([r][d], pitch P elements, a multiple
// of 16 bytes), zero past `time` and past head_dim. `vector`: 16-byte loads (head_dim
// and the row stride multiples of 16 bytes, the data 16-byte aligned).
template <int D, int P, class E>
__device__ void load_tile(Rows<const E*> src, std::int64_t first, const Geometry& g, bool vector, E* tile) {
  constexpr int kPer = 16 / sizeof(E);  // elements per 16-byte chunk
  constexpr int kChunks = D / kPer;
  static_assert(D % kPer == 0 && P % kPer == 0, "rows of whole chunks");
  for (int e = threadIdx.x; e < kTileRows * kChunks; e += kTileThreads) {
    const int r = e / kChunks, c = (e % kChunks) * kPer;
    const std::int64_t row = first + r;
    alignas(16) E v[kPer];
    const E* from = src.base + row * src.stride + c;
    if (row < g.time && vector && c + kPer <= g.head_dim) {
      *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(from);
    } else {
#pragma unroll
      for (int k = 0; k < kPer; ++k) v[k] = row < g.time && c + k < g.head_dim ? from[k] : E{0};
    }
    *reinterpret_cast<uint4*>(tile + r * P + c) = *reinterpret_cast<const uint4*>(v);
  }
}

// Max and sum over the 4 lanes of a row group (the lanes holding one row).
__device__ __forceinline__ float row_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float row_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// bf16 on tensor cores (cuda_attention_mma.cu); head_dim <= 128.
void forward_bf16(const BFloat16* qkv, const AttentionShape& s, const AttentionDropout& drop, BFloat16* out,
                  float* lse);
void backward_bf16(const BFloat16* qkv, const BFloat16* out, const BFloat16* grad_out, const float* lse,
                   const AttentionShape& s, const AttentionDropout& drop, float* delta, BFloat16* grad_qkv);
// f32 on tensor cores, 3xTF32 (cuda_attention_tf32.cu); head_dim <= 128.
void forward_f32(const float* qkv, const AttentionShape& s, const AttentionDropout& drop, float* out, float* lse);
void backward_f32(const float* qkv, const float* out, const float* grad_out, const float* lse, const AttentionShape& s,
                  const AttentionDropout& drop, float* delta, float* grad_qkv);

}  // namespace troupe::tensor::cuda_backend::attention
