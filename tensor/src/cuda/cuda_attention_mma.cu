// Causal self-attention for bf16 on tensor cores: the flash-attention-2 layout (Dao,
// 2023) with mma.sync.m16n8k16 (bf16 in, f32 accumulated). A block has 4 warps and 64
// rows of its own side (queries in the forward and in dQ, keys in dK/dV), 16 per warp;
// it walks the other side in 64-row tiles staged in shared memory, skipping the tiles
// the causal mask hides. The scores of a warp's 16 rows against a tile stay in
// registers, in the accumulator layout of the mma, which is also the layout of its
// A operand: P (or dS) feeds the next product without a trip through shared memory.
//
//   forward   S = Q K^T, online softmax (base 2), O += P V; writes O / l and the lse
//   dq        delta = rowsum(dO * O); S, dP = dO V^T, dS = P (dP - delta), dQ += dS K
//   dkdv      S^T = K Q^T, dV += P^T dO, dP^T = V dO^T, dK += dS^T Q
//
// As in cuda_attention.cu, dQ has its own kernel so that nothing is summed with
// atomics: every run gives the same bits. P and dS are rounded to bf16 before their
// products, as flash attention does; dropout uses the same Philox words as the CPU.
//
// Every tile is stored row-major ([row][d]). A B operand along d (K for S = Q K^T)
// is read with plain 32-bit loads; one along the rows (V for P V, K for dS K, Q and dO
// in dkdv) with ldmatrix.trans, which hands each lane the pairs the mma wants. Rows are
// padded by 8 bf16 so that the 8 rows one fragment load touches fall in different
// banks. Head sizes up to 128 run in the 32-, 64- or 128-wide kernels with the columns
// past head_dim zero.
#include <cuda_bf16.h>

#include "cuda_attention.cuh"

namespace troupe::tensor::cuda_backend::attention {

namespace {

using Bits = std::uint16_t;  // a bf16 as stored

constexpr int kRows = kTileRows;
constexpr int kThreads = kTileThreads;
template <int D>
constexpr int kPitch = D + 8;  // a tile's row, in bf16
// A tile's size, in bf16 (a multiple of 8: tiles stay 16-byte aligned).
template <int D>
constexpr int kTileBits = kRows* kPitch<D>;

__device__ __forceinline__ std::uint32_t word(const Bits* tile, int index) {
  return *reinterpret_cast<const std::uint32_t*>(tile + index);
}

__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// c += a b for a 16x16 A (row-major fragment) and a 16x8 B (column fragment).
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A operand, rows [r0, r0 + 16) x columns [k0, k0 + 16) of a row-major tile.
template <int P>
__device__ __forceinline__ void load_a(const Bits* tile, int r0, int k0, const Lane& l, std::uint32_t (&a)[4]) {
  const int top = (r0 + l.group) * P + k0 + 2 * l.pair, bottom = top + 8 * P;
  a[0] = word(tile, top);
  a[1] = word(tile, bottom);
  a[2] = word(tile, top + 8);
  a[3] = word(tile, bottom + 8);
}

// c[n] += A b_n for the 8-column blocks n of B, B[k][n] = tile[n][k] (k contiguous).
template <int P, int N>
__device__ __forceinline__ void mma_row(float (&c)[N][4], const std::uint32_t (&a)[4], const Bits* tile, int k0,
                                        const Lane& l) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int at = (n * 8 + l.group) * P + k0 + 2 * l.pair;
    mma(c[n], a, word(tile, at), word(tile, at + 8));
  }
}

// B operands of the 8-column blocks n0 and n0 + 8 for rows [k0, k0 + 16) of a
// row-major [k][n] tile: b[0], b[1] for block n0, b[2], b[3] for n0 + 8. Lanes 8m to
// 8m + 7 name the rows of matrix m: rows k0 + 8 (m & 1), columns n0 + 8 (m >> 1).
__device__ __forceinline__ void load_b_along_rows(const Bits* tile, int pitch, int k0, int n0, std::uint32_t (&b)[4]) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  const Bits* row = tile + (k0 + lane % 8 + (m & 1) * 8) * pitch + n0 + (m >> 1) * 8;
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(address)
               : "memory");
}

// c[n] += A b_n for the 8-column blocks n of B = tile rows [k0, k0 + 16) (n along the
// tile's columns).
template <int P, int N>
__device__ __forceinline__ void mma_along_rows(float (&c)[N][4], const std::uint32_t (&a)[4], const Bits* tile,
                                               int k0) {
  static_assert(N % 2 == 0, "blocks go in pairs");
#pragma unroll
  for (int n = 0; n < N; n += 2) {
    std::uint32_t b[4];
    load_b_along_rows(tile, P, k0, n * 8, b);
    mma(c[n], a, b[0], b[1]);
    mma(c[n + 1], a, b[2], b[3]);
  }
}

// The 16 x 16 A operand of columns [16 kk, 16 kk + 16) of a 16 x 64 accumulator (P or
// dS), rounded to bf16: the accumulator's blocks 2 kk and 2 kk + 1, as they lie.
__device__ __forceinline__ void as_a(const float (&c)[8][4], int kk, std::uint32_t (&a)[4]) {
  a[0] = pack(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

template <int D, bool kDropout>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const Bits* qkv, Geometry g, bool vector, Bits* out, float* lse) {
  extern __shared__ __align__(16) unsigned char shared[];
  Bits* qs = reinterpret_cast<Bits*>(shared);  // [64][D + 8]
  Bits* ks = qs + kTileBits<D>;                // [64][D + 8]
  Bits* vs = ks + kTileBits<D>;                // [64][D + 8]
  const Lane l;
  const Heads at(g);
  const int warp = threadIdx.x / 32;
  const std::int64_t first = query_tile_first(g.time);
  const std::int64_t row0 = first + warp * 16 + l.group;  // this lane's rows: row0 and row0 + 8
  const float scale = static_cast<float>(g.scale) * kLog2e;
  load_tile<D, kPitch<D>>(qkv_rows(qkv, g, at, 0), first, g, vector, qs);

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0, 0};  // per row: running max (base 2) and this lane's sum
  for (std::int64_t k0 = 0; k0 <= first; k0 += kRows) {
    __syncthreads();  // the previous tiles are consumed
    load_tile<D, kPitch<D>>(qkv_rows(qkv, g, at, 1), k0, g, vector, ks);
    load_tile<D, kPitch<D>>(qkv_rows(qkv, g, at, 2), k0, g, vector, vs);
    __syncthreads();
    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[4];
      load_a<kPitch<D>>(qs, warp * 16, kk * 16, l, a);
      mma_row<kPitch<D>>(s, a, ks, kk * 16, l);
    }
    online_softmax<kDropout>(s, o, m, sum, k0 == first, scale, row0, k0, l, g, at.bh);
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      std::uint32_t a[4];
      as_a(s, kk, a);
      mma_along_rows<kPitch<D>>(o, a, vs, kk * 16);
    }
  }
  const float total[2] = {row_sum(sum[0]), row_sum(sum[1])};
  store_rows<D>(o, 1.0f / total[0], 1.0f / total[1], out_rows(out, g, at), first + warp * 16, g, l);
  store_lse(m, total, row0, l, g, at.bh, lse);
}

template <int D, bool kDropout>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(const Bits* qkv, const Bits* out, const Bits* grad_out, const float* lse, Geometry g,
                       bool vector, float* delta, Bits* grad_qkv) {
  extern __shared__ __align__(16) unsigned char shared[];
  Bits* qs = reinterpret_cast<Bits*>(shared);                    // [64][D + 8]
  Bits* dys = qs + kTileBits<D>;                                 // [64][D + 8]
  Bits* ks = dys + kTileBits<D>;                                 // [64][D + 8]
  Bits* vs = ks + kTileBits<D>;                                  // [64][D + 8]
  float* delta_s = reinterpret_cast<float*>(vs + kTileBits<D>);  // [64]
  const Lane l;
  const Heads at(g);
  const int warp = threadIdx.x / 32;
  const std::int64_t first = query_tile_first(g.time);
  const std::int64_t row0 = first + warp * 16 + l.group;
  const float scale = static_cast<float>(g.scale) * kLog2e;

  float row_lse[2], row_delta[2];
  start_dq_block<D, kPitch<D>>(qkv, out, grad_out, lse, g, at, first, vector, qs, dys, delta_s, delta, row_lse,
                               row_delta);

  float dq[D / 8][4] = {};
  for (std::int64_t k0 = 0; k0 <= first; k0 += kRows) {
    __syncthreads();
    load_tile<D, kPitch<D>>(qkv_rows(qkv, g, at, 1), k0, g, vector, ks);
    load_tile<D, kPitch<D>>(qkv_rows(qkv, g, at, 2), k0, g, vector, vs);
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[4];
      load_a<kPitch<D>>(qs, warp * 16, kk * 16, l, a);
      mma_row<kPitch<D>>(s, a, ks, kk * 16, l);
      load_a<kPitch<D>>(dys, warp * 16, kk * 16, l, a);
      mma_row<kPitch<D>>(dp, a, vs, kk * 16, l);
    }
    ds_of_tile<kDropout>(s, dp, k0 == first, scale, row_lse, row_delta, row0, k0, l, g, at.bh);  // s = dS
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      std::uint32_t a[4];
      as_a(s, kk, a);
      mma_along_rows<kPitch<D>>(dq, a, ks, kk * 16);
    }
  }
  const float by = static_cast<float>(g.scale);
  store_rows<D>(dq, by, by, qkv_rows(grad_qkv, g, at, 0), first + warp * 16, g, l);
}

template <int D, bool kDropout>
__global__ void __launch_bounds__(kThreads)
    backward_dkdv_kernel(const Bits* qkv, const Bits* grad_out, const float* lse, const float* delta, Geometry g,
                         bool vector, Bits* grad_qkv) {
  extern __shared__ __align__(16) unsigned char shared[];
  Bits* ks = reinterpret_cast<Bits*>(shared);                   // own keys [64][D + 8]
  Bits* vs = ks + kTileBits<D>;                                 // own values [64][D + 8]
  Bits* qs = vs + kTileBits<D>;                                 // [64][D + 8]
  Bits* dys = qs + kTileBits<D>;                                // [64][D + 8]
  float* lse_s = reinterpret_cast<float*>(dys + kTileBits<D>);  // [64], base 2
  float* delta_s = lse_s + kRows;                               // [64]
  const Lane l;
  const Heads at(g);
  const int warp = threadIdx.x / 32;
  const std::int64_t first =
      static_cast<std::int64_t>(blockIdx.y) * kRows;      // the first key tiles have the most queries
  const std::int64_t key0 = first + warp * 16 + l.group;  // this lane's keys: key0 and key0 + 8
  const float scale = static_cast<float>(g.scale) * kLog2e;
  const auto dy = out_rows(grad_out, g, at);
  load_tile<D, kPitch<D>>(qkv_rows(qkv, g, at, 1), first, g, vector, ks);
  load_tile<D, kPitch<D>>(qkv_rows(qkv, g, at, 2), first, g, vector, vs);

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (std::int64_t q0 = first; q0 < g.time; q0 += kRows) {
    __syncthreads();
    load_tile<D, kPitch<D>>(qkv_rows(qkv, g, at, 0), q0, g, vector, qs);
    load_tile<D, kPitch<D>>(dy, q0, g, vector, dys);
    stage_query_stats(lse, delta, q0, g, at.bh, lse_s, delta_s);
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};  // S^T and dP^T: this warp's 16 keys x 64 queries
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[4];
      load_a<kPitch<D>>(ks, warp * 16, kk * 16, l, a);
      mma_row<kPitch<D>>(s, a, qs, kk * 16, l);
      load_a<kPitch<D>>(vs, warp * 16, kk * 16, l, a);
      mma_row<kPitch<D>>(dp, a, dys, kk * 16, l);
    }
    transposed_p_and_ds<kDropout>(s, dp, scale, lse_s, delta_s, key0, q0, l, g, at.bh);  // s = P^T, dp = dS^T
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      std::uint32_t a[4];
      as_a(s, kk, a);
      mma_along_rows<kPitch<D>>(dv, a, dys, kk * 16);
      as_a(dp, kk, a);
      mma_along_rows<kPitch<D>>(dk, a, qs, kk * 16);
    }
  }
  const float by = static_cast<float>(g.scale);
  store_rows<D>(dk, by, by, qkv_rows(grad_qkv, g, at, 1), first + warp * 16, g, l);
  store_rows<D>(dv, 1.0f, 1.0f, qkv_rows(grad_qkv, g, at, 2), first + warp * 16, g, l);
}

}  // namespace

void forward_bf16(const BFloat16* qkv, const AttentionShape& s, const AttentionDropout& drop, BFloat16* out,
                  float* lse) {
  const Geometry g = geometry_of(s, drop);
  const bool vector = s.head_dim % 8 == 0 && s.channels % 8 == 0 && aligned16(qkv);
  dispatch_head(s.head_dim, drop.p > 0, [&](auto width, auto dropout) {
    constexpr int D = decltype(width)::value;
    launch(forward_kernel<D, decltype(dropout)::value>, s, kRows, kThreads, 3 * kTileBits<D> * sizeof(Bits),
           "causal attention (bf16)", reinterpret_cast<const Bits*>(qkv), g, vector, reinterpret_cast<Bits*>(out), lse);
  });
}

void backward_bf16(const BFloat16* qkv, const BFloat16* out, const BFloat16* grad_out, const float* lse,
                   const AttentionShape& s, const AttentionDropout& drop, float* delta, BFloat16* grad_qkv) {
  const Geometry g = geometry_of(s, drop);
  const bool vector = s.head_dim % 8 == 0 && s.channels % 8 == 0 && aligned16(qkv) && aligned16(grad_out);
  const auto* q = reinterpret_cast<const Bits*>(qkv);
  const auto* gy = reinterpret_cast<const Bits*>(grad_out);
  auto* gq = reinterpret_cast<Bits*>(grad_qkv);
  dispatch_head(s.head_dim, drop.p > 0, [&](auto width, auto dropout) {
    constexpr int D = decltype(width)::value;
    constexpr bool drop_on = decltype(dropout)::value;
    launch(backward_dq_kernel<D, drop_on>, s, kRows, kThreads, 4 * kTileBits<D> * sizeof(Bits) + kRows * sizeof(float),
           "causal attention backward (bf16, dq)", q, reinterpret_cast<const Bits*>(out), gy, lse, g, vector, delta,
           gq);
    launch(backward_dkdv_kernel<D, drop_on>, s, kRows, kThreads,
           4 * kTileBits<D> * sizeof(Bits) + 2 * kRows * sizeof(float), "causal attention backward (bf16, dk, dv)", q,
           gy, lse, static_cast<const float*>(delta), g, vector, gq);
  });
}

}  // namespace troupe::tensor::cuda_backend::attention
