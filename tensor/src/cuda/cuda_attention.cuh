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
  return {s.time,
          s.channels,
          s.heads,
          s.head_dim,
          1.0 / std::sqrt(static_cast<double>(s.head_dim)),
          drop.p,
          static_cast<float>(1.0 - drop.p),
          drop.seed,
          drop.offset};
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
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what,
             __FILE__, __LINE__);
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

// ---- the softmax arithmetic of both tensor-core paths, on a warp's 16 x 64 tile of
// scores in the mma accumulator layout: element e of block n lies at row
// row0 + 8 (e >= 2), column col0 + 8 n + 2 pair + (e & 1), with row0 the lane's first
// row and col0 the tile's first column. Scores are scaled by scale = log2(e) / sqrt(D):
// the softmax runs in base 2 (exp2f), the log-sum-exp is stored in base e.
constexpr float kLog2e = 1.4426950408889634f;

__device__ inline std::int64_t row_of(std::int64_t row0, int e) { return row0 + (e >= 2 ? 8 : 0); }
__device__ inline std::int64_t col_of(std::int64_t col0, const Lane& l, int n, int e) {
  return col0 + n * 8 + 2 * l.pair + (e & 1);
}

// One key tile of the forward's online softmax: scales the scores s and masks them
// above the diagonal (`diagonal`: the tile holds the mask's edge), raises the rows'
// running maxima m, rescales the output o and the lane's sums by the change, and leaves
// in s the weights for P V (after dropout; the sums take them before).
template <bool kDropout, int N>
__device__ void online_softmax(float (&s)[8][4], float (&o)[N][4], float (&m)[2], float (&sum)[2], bool diagonal,
                               float scale, std::int64_t row0, std::int64_t col0, const Lane& l, const Geometry& g,
                               std::int64_t bh) {
  float next[2] = {m[0], m[1]};
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = diagonal && col_of(col0, l, n, e) > row_of(row0, e) ? -INFINITY : s[n][e] * scale;
      next[e / 2] = fmaxf(next[e / 2], s[n][e]);
    }
  float correction[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    next[r] = row_max(next[r]);
    correction[r] = exp2f(m[r] - next[r]);
    m[r] = next[r];
    sum[r] *= correction[r];
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    o[n][0] *= correction[0];
    o[n][1] *= correction[0];
    o[n][2] *= correction[1];
    o[n][3] *= correction[1];
  }
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[n][e] - m[e / 2]);
      sum[e / 2] += p;
      s[n][e] = p;
      if constexpr (kDropout) s[n][e] *= dropout_factor<float>(g, bh, row_of(row0, e), col_of(col0, l, n, e));
    }
}

// The forward's log-sum-exp of the lane's rows, in base e, from the running maxima and
// the rows' total sums.
__device__ inline void store_lse(const float (&m)[2], const float (&total)[2], std::int64_t row0, const Lane& l,
                                 const Geometry& g, std::int64_t bh, float* lse) {
  if (l.pair != 0) return;
  for (int r = 0; r < 2; ++r) {
    const std::int64_t row = row0 + 8 * r;
    if (row < g.time) lse[bh * g.time + row] = (m[r] + log2f(total[r])) / kLog2e;
  }
}

// dS = P (dP - delta) for a tile of the dq kernel, into s: P recomputed from the
// scores and the rows' log-sum-exp (base 2), zero above the diagonal; dropout scales dP.
template <bool kDropout>
__device__ void ds_of_tile(float (&s)[8][4], const float (&dp)[8][4], bool diagonal, float scale,
                           const float (&row_lse)[2], const float (&row_delta)[2], std::int64_t row0, std::int64_t col0,
                           const Lane& l, const Geometry& g, std::int64_t bh) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const std::int64_t row = row_of(row0, e), col = col_of(col0, l, n, e);
      const float p = diagonal && col > row ? 0.0f : exp2f(s[n][e] * scale - row_lse[e / 2]);
      float dpe = dp[n][e];
      if constexpr (kDropout) dpe *= dropout_factor<float>(g, bh, row, col);
      s[n][e] = p * (dpe - row_delta[e / 2]);
    }
}

// For a tile of the dkdv kernel (this warp's keys x 64 queries from q0): s becomes P^T
// after dropout (for dV) and dp becomes dS^T (for dK); the queries' log-sum-exp (base
// 2) and delta come from shared memory. Queries before a key or past the end get 0.
template <bool kDropout>
__device__ void transposed_p_and_ds(float (&s)[8][4], float (&dp)[8][4], float scale, const float* lse_s,
                                    const float* delta_s, std::int64_t key0, std::int64_t q0, const Lane& l,
                                    const Geometry& g, std::int64_t bh) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const std::int64_t key = row_of(key0, e), query = col_of(q0, l, n, e);
      const int c = static_cast<int>(query - q0);
      const float p = query < g.time && query >= key ? exp2f(s[n][e] * scale - lse_s[c]) : 0.0f;
      float kept = p, dpe = dp[n][e];
      if constexpr (kDropout) {
        const float z = dropout_factor<float>(g, bh, query, key);
        kept *= z;
        dpe *= z;
      }
      s[n][e] = kept;
      dp[n][e] = p * (dpe - delta_s[c]);
    }
}

// The dq kernel's rows' log-sum-exp (base 2) and delta, for the lane's two rows.
__device__ inline void row_stats(const float* lse, const float* delta_s, std::int64_t row0, int warp, const Lane& l,
                                 const Geometry& g, std::int64_t bh, float (&row_lse)[2], float (&row_delta)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t row = row0 + 8 * r;
    row_lse[r] = row < g.time ? lse[bh * g.time + row] * kLog2e : 0.0f;
    row_delta[r] = delta_s[warp * 16 + l.group + 8 * r];
  }
}

// A query tile's queries' log-sum-exp (base 2) and delta into shared memory, for dkdv.
__device__ inline void stage_query_stats(const float* lse, const float* delta, std::int64_t q0, const Geometry& g,
                                         std::int64_t bh, float* lse_s, float* delta_s) {
  if (threadIdx.x >= kTileRows) return;
  const std::int64_t row = q0 + threadIdx.x;
  lse_s[threadIdx.x] = row < g.time ? lse[bh * g.time + row] * kLog2e : 0.0f;
  delta_s[threadIdx.x] = row < g.time ? delta[bh * g.time + row] : 0.0f;
}

__device__ inline float to_float(std::uint16_t bf16_bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bf16_bits) << 16);
}
__device__ inline float to_float(float x) { return x; }
__device__ inline void store_float(std::uint16_t& bf16_bits, float x) { bf16_bits = BFloat16(x).bits; }
__device__ inline void store_float(float& dst, float x) { dst = x; }

// delta = rowsum(dO * O) for the 64 rows from `first`, a warp per row, into delta_s and
// (for dkdv) delta.
template <class E>
__device__ void row_deltas(Rows<const E*> y, Rows<const E*> dy, std::int64_t first, const Geometry& g, std::int64_t bh,
                           float* delta_s, float* delta) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp * 16; r < warp * 16 + 16; ++r) {
    const std::int64_t row = first + r;
    float part = 0;
    if (row < g.time)
      for (std::int64_t d = lane; d < g.head_dim; d += 32)
        part += to_float(dy.base[row * dy.stride + d]) * to_float(y.base[row * y.stride + d]);
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) part += __shfl_xor_sync(0xffffffffu, part, mask);
    if (lane == 0) {
      delta_s[r] = part;
      if (row < g.time) delta[bh * g.time + row] = part;
    }
  }
}

// What both dq kernels do first: delta = rowsum(dO * O) for the block's 64 rows from
// `first` (into delta_s, and into delta for dkdv), the rows' Q and dO tiles (pitch P),
// and the lane's two rows' log-sum-exp (base 2) and delta.
template <int D, int P, class E>
__device__ void start_dq_block(const E* qkv, const E* out, const E* grad_out, const float* lse, const Geometry& g,
                               const Heads& at, std::int64_t first, bool vector, E* qs, E* dys, float* delta_s,
                               float* delta, float (&row_lse)[2], float (&row_delta)[2]) {
  const auto y = out_rows(out, g, at), dy = out_rows(grad_out, g, at);
  row_deltas(y, dy, first, g, at.bh, delta_s, delta);
  load_tile<D, P>(qkv_rows(qkv, g, at, 0), first, g, vector, qs);
  load_tile<D, P>(dy, first, g, vector, dys);
  __syncthreads();
  const Lane l;
  const int warp = threadIdx.x / 32;
  row_stats(lse, delta_s, first + warp * 16 + l.group, warp, l, g, at.bh, row_lse, row_delta);
}

// Stores a 16 x D accumulator as the warp's rows [row0, row0 + 16) of `dst`, row r
// times factor[r >= 8], skipping rows past time and columns past head_dim.
template <int D, class E>
__device__ void store_rows(const float (&c)[D / 8][4], float factor0, float factor1, Rows<E*> dst, std::int64_t row0,
                           const Geometry& g, const Lane& l) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const std::int64_t row = row0 + l.group + (e >= 2 ? 8 : 0);
      const int d = n * 8 + 2 * l.pair + (e & 1);
      if (row < g.time && d < g.head_dim)
        store_float(dst.base[row * dst.stride + d], c[n][e] * (e >= 2 ? factor1 : factor0));
    }
}

// Calls body(integral_constant<int, D>{}, bool_constant<dropout>{}) for the smallest
// of 32, 64, 128 that holds head_dim.
template <class Body>
void dispatch_head(std::int64_t head_dim, bool dropout, Body&& body) {
  const auto by_dropout = [&](auto width) {
    if (dropout)
      body(width, std::true_type{});
    else
      body(width, std::false_type{});
  };
  if (head_dim <= 32)
    by_dropout(std::integral_constant<int, 32>{});
  else if (head_dim <= 64)
    by_dropout(std::integral_constant<int, 64>{});
  else
    by_dropout(std::integral_constant<int, 128>{});
}

// bf16 on tensor cores (cuda_attention_mma.cu); head_dim <= 128.
void forward_bf16(const BFloat16* qkv, const AttentionShape& s, const AttentionDropout& drop, BFloat16* out,
                  float* lse);
void backward_bf16(const BFloat16* qkv, const BFloat16* out, const BFloat16* grad_out, const float* lse,
                   const AttentionShape& s, const AttentionDropout& drop, float* delta, BFloat16* grad_qkv);
// f32 on tensor cores, 3xTF32, or 1xTF32 where `tf32` (cuda_attention_tf32.cu);
// head_dim <= 128.
void forward_f32(const float* qkv, const AttentionShape& s, const AttentionDropout& drop, bool tf32, float* out,
                 float* lse);
void backward_f32(const float* qkv, const float* out, const float* grad_out, const float* lse, const AttentionShape& s,
                  const AttentionDropout& drop, bool tf32, float* delta, float* grad_qkv);

}  // namespace troupe::tensor::cuda_backend::attention
