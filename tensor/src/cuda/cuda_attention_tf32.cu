// Causal self-attention for f32 on tensor cores: the layout of cuda_attention_mma.cu
// (a block of 4 warps owns 64 rows, 16 per warp, and walks the other side in 64-row
// tiles), with mma.sync.m16n8k8 in TF32. TF32 keeps 10 bits of an f32's 23, so each
// product is taken as three (CUTLASS's "3xTF32"): x = big + small, both TF32, and
//   a b ~ a_small b_big + a_big b_small + a_big b_big,
// dropping a_small b_small, about 2^-22 of the product: f32 accuracy at a third of
// TF32's rate, which is still several times the CUDA cores' f32 rate. With TF32
// allowed (tensor/cuda_math.hpp) each kernel is built with kFast and takes a_big b_big
// alone: TF32's accuracy, as torch's allow_tf32.
//
// The same three kernels as the bf16 ones (forward; dq with delta; dkdv), with the
// softmax arithmetic they share (cuda_attention.cuh), but P and dS stay f32 and feed
// the next product from the registers they were computed in (accumulator_times).
//
// Tiles are row-major [row][d], rows padded to D + 4 floats: fragment loads across a
// row (A operands, B = K for Q K^T) and down a column in accumulator_times' order
// both hit 32 distinct banks.
#include "cuda_attention.cuh"

namespace troupe::tensor::cuda_backend::attention {

namespace {

constexpr int kRows = kTileRows;
constexpr int kThreads = kTileThreads;
template <int D>
constexpr int kAcross = D + 4;  // a tile's row pitch, in floats

// x as big + small, both TF32, each rounded to nearest (ties away, as cvt.rna): the
// rounding adds half a TF32 ulp to the bits, and the tensor core ignores an operand's
// 13 bits below TF32's (big drops them itself, as it is subtracted from x). Four
// integer and float operations where two cvt.rna.tf32.f32 took longer, with the same
// bits: the kernels split every operand they load, so the split is on their critical
// path.
struct Split {
  std::uint32_t big, small;
};
__device__ __forceinline__ Split split(float x) {
  const std::uint32_t big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  return {big, __float_as_uint(x - __uint_as_float(big)) + 0x1000u};
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                         std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A 16 x 8 A operand split for 3xTF32.
struct SplitA {
  Split part[4];
};

// c += a b as three TF32 products, the small ones first; kFast: the big one alone (the
// small halves, unused, are never computed).
template <bool kFast>
__device__ __forceinline__ void mma3(float (&c)[4], const SplitA& a, float b0, float b1) {
  const Split x = split(b0), y = split(b1);
  if constexpr (!kFast) {
    mma_tf32(c, a.part[0].small, a.part[1].small, a.part[2].small, a.part[3].small, x.big, y.big);
    mma_tf32(c, a.part[0].big, a.part[1].big, a.part[2].big, a.part[3].big, x.small, y.small);
  }
  mma_tf32(c, a.part[0].big, a.part[1].big, a.part[2].big, a.part[3].big, x.big, y.big);
}

// A operand, rows [r0, r0 + 16) x columns [k0, k0 + 8) of a row-major tile: a0 (g, t),
// a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4).
template <int P>
__device__ __forceinline__ SplitA load_a(const float* tile, int r0, int k0, const Lane& l) {
  const float* top = tile + (r0 + l.group) * P + k0 + l.pair;
  return {{split(top[0]), split(top[8 * P]), split(top[4]), split(top[8 * P + 4])}};
}

// c[n] += A b_n, B[k][n] = tile[n][k] (B's columns are the tile's rows: K for Q K^T).
template <bool kFast, int P, int N>
__device__ __forceinline__ void mma_across(float (&c)[N][4], const SplitA& a, const float* tile, int k0,
                                           const Lane& l) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const float* b = tile + (n * 8 + l.group) * P + k0 + l.pair;
    mma3<kFast>(c[n], a, b[0], b[4]);
  }
}

// c[n] += S b_n for S this warp's 16 x 64 accumulator (scores, P or dS, in the mma's C
// layout) and B rows [0, 64) of `tile` (B[k][n] = tile[k][n]: V for P V). A lane's
// accumulator holds columns 2t and 2t + 1 of each 8, where an A operand wants columns
// t and t + 4. The product runs over each 8 keys in that order instead, with B's rows
// taken in the same order (rows 2t and 2t + 1 as B's rows t and t + 4): the sum is the
// same, and the accumulator is the A operand as it stands, with no trip through shared
// memory.
template <bool kFast, int P, int N>
__device__ __forceinline__ void accumulator_times(float (&c)[N][4], const float (&s)[8][4], const float* tile,
                                                  const Lane& l) {
#pragma unroll
  for (int kk = 0; kk < kRows / 8; ++kk) {
    const SplitA a{{split(s[kk][0]), split(s[kk][2]), split(s[kk][1]), split(s[kk][3])}};
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const float* b = tile + (kk * 8 + 2 * l.pair) * P + n * 8 + l.group;
      mma3<kFast>(c[n], a, b[0], b[P]);
    }
  }
}

// Four blocks an SM (128 registers a thread; 24 bytes spilled without dropout), as
// many as its shared memory allows.
template <int D, bool kDropout, bool kFast>
__global__ void __launch_bounds__(kThreads, 4)
    forward_kernel(const float* qkv, Geometry g, bool vector, float* out, float* lse) {
  extern __shared__ __align__(16) unsigned char shared[];
  float* qs = reinterpret_cast<float*>(shared);  // [64][D + 4]
  float* ks = qs + kRows * kAcross<D>;           // [64][D + 4]
  float* vs = ks + kRows * kAcross<D>;           // [64][D + 4]
  const int warp = threadIdx.x / 32;
  const Lane l;
  const Heads at(g);
  const std::int64_t first = query_tile_first(g.time);
  const std::int64_t row0 = first + warp * 16 + l.group;  // this lane's rows: row0 and row0 + 8
  const float scale = static_cast<float>(g.scale) * kLog2e;
  load_tile<D, kAcross<D>>(qkv_rows(qkv, g, at, 0), first, g, vector, qs);

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0, 0};
  for (std::int64_t k0 = 0; k0 <= first; k0 += kRows) {
    __syncthreads();
    load_tile<D, kAcross<D>>(qkv_rows(qkv, g, at, 1), k0, g, vector, ks);
    load_tile<D, kAcross<D>>(qkv_rows(qkv, g, at, 2), k0, g, vector, vs);
    __syncthreads();
    float s[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 8; ++kk)
      mma_across<kFast, kAcross<D>>(s, load_a<kAcross<D>>(qs, warp * 16, kk * 8, l), ks, kk * 8, l);
    online_softmax<kDropout>(s, o, m, sum, k0 == first, scale, row0, k0, l, g, at.bh);
    accumulator_times<kFast, kAcross<D>>(o, s, vs, l);
  }
  const float total[2] = {row_sum(sum[0]), row_sum(sum[1])};
  store_rows<D>(o, 1.0f / total[0], 1.0f / total[1], out_rows(out, g, at), first + warp * 16, g, l);
  store_lse(m, total, row0, l, g, at.bh, lse);
}

template <int D, bool kDropout, bool kFast>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(const float* qkv, const float* out, const float* grad_out, const float* lse, Geometry g,
                       bool vector, float* delta, float* grad_qkv) {
  constexpr int P = kAcross<D>;
  extern __shared__ __align__(16) unsigned char shared[];
  float* qs = reinterpret_cast<float*>(shared);  // [64][P]
  float* dys = qs + kRows * P;
  float* ks = dys + kRows * P;
  float* vs = ks + kRows * P;
  float* delta_s = vs + kRows * P;  // [64]
  const int warp = threadIdx.x / 32;
  const Lane l;
  const Heads at(g);
  const std::int64_t first = query_tile_first(g.time);
  const std::int64_t row0 = first + warp * 16 + l.group;
  const float scale = static_cast<float>(g.scale) * kLog2e;

  float row_lse[2], row_delta[2];
  start_dq_block<D, P>(qkv, out, grad_out, lse, g, at, first, vector, qs, dys, delta_s, delta, row_lse, row_delta);

  float dq[D / 8][4] = {};
  for (std::int64_t k0 = 0; k0 <= first; k0 += kRows) {
    __syncthreads();
    load_tile<D, P>(qkv_rows(qkv, g, at, 1), k0, g, vector, ks);
    load_tile<D, P>(qkv_rows(qkv, g, at, 2), k0, g, vector, vs);
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 8; ++kk) {
      mma_across<kFast, P>(s, load_a<P>(qs, warp * 16, kk * 8, l), ks, kk * 8, l);
      mma_across<kFast, P>(dp, load_a<P>(dys, warp * 16, kk * 8, l), vs, kk * 8, l);
    }
    ds_of_tile<kDropout>(s, dp, k0 == first, scale, row_lse, row_delta, row0, k0, l, g, at.bh);  // s = dS
    accumulator_times<kFast, P>(dq, s, ks, l);
  }
  const float by = static_cast<float>(g.scale);
  store_rows<D>(dq, by, by, qkv_rows(grad_qkv, g, at, 0), first + warp * 16, g, l);
}

// Three blocks an SM (168 registers a thread, a few bytes spilled without dropout): at
// two, the SM had too few warps to hide the mma and load latencies.
template <int D, bool kDropout, bool kFast>
__global__ void __launch_bounds__(kThreads, 3)
    backward_dkdv_kernel(const float* qkv, const float* grad_out, const float* lse, const float* delta, Geometry g,
                         bool vector, float* grad_qkv) {
  constexpr int P = kAcross<D>;
  extern __shared__ __align__(16) unsigned char shared[];
  float* ks = reinterpret_cast<float*>(shared);  // own keys [64][P]
  float* vs = ks + kRows * P;                    // own values
  float* qs = vs + kRows * P;
  float* dys = qs + kRows * P;
  float* lse_s = dys + kRows * P;  // [64], base 2
  float* delta_s = lse_s + kRows;  // [64]
  const int warp = threadIdx.x / 32;
  const Lane l;
  const Heads at(g);
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kRows;
  const std::int64_t key0 = first + warp * 16 + l.group;
  const float scale = static_cast<float>(g.scale) * kLog2e;
  const auto dy = out_rows(grad_out, g, at);
  load_tile<D, P>(qkv_rows(qkv, g, at, 1), first, g, vector, ks);
  load_tile<D, P>(qkv_rows(qkv, g, at, 2), first, g, vector, vs);

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (std::int64_t q0 = first; q0 < g.time; q0 += kRows) {
    __syncthreads();
    load_tile<D, P>(qkv_rows(qkv, g, at, 0), q0, g, vector, qs);
    load_tile<D, P>(dy, q0, g, vector, dys);
    stage_query_stats(lse, delta, q0, g, at.bh, lse_s, delta_s);
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};  // S^T and dP^T: this warp's 16 keys x 64 queries
#pragma unroll
    for (int kk = 0; kk < D / 8; ++kk) {
      mma_across<kFast, P>(s, load_a<P>(ks, warp * 16, kk * 8, l), qs, kk * 8, l);
      mma_across<kFast, P>(dp, load_a<P>(vs, warp * 16, kk * 8, l), dys, kk * 8, l);
    }
    transposed_p_and_ds<kDropout>(s, dp, scale, lse_s, delta_s, key0, q0, l, g, at.bh);  // s = P^T, dp = dS^T
    accumulator_times<kFast, P>(dv, s, dys, l);
    accumulator_times<kFast, P>(dk, dp, qs, l);
  }
  const float by = static_cast<float>(g.scale);
  store_rows<D>(dk, by, by, qkv_rows(grad_qkv, g, at, 1), first + warp * 16, g, l);
  store_rows<D>(dv, 1.0f, 1.0f, qkv_rows(grad_qkv, g, at, 2), first + warp * 16, g, l);
}

}  // namespace

void forward_f32(const float* qkv, const AttentionShape& s, const AttentionDropout& drop, bool tf32, float* out,
                 float* lse) {
  const Geometry g = geometry_of(s, drop);
  const bool vector = s.head_dim % 4 == 0 && s.channels % 4 == 0 && aligned16(qkv);
  dispatch_head(s.head_dim, drop.p > 0, [&](auto width, auto dropout) {
    constexpr int D = decltype(width)::value;
    constexpr bool drop_on = decltype(dropout)::value;
    const std::size_t floats = 3 * kRows * kAcross<D>;
    if (tf32)
      launch(forward_kernel<D, drop_on, true>, s, kRows, kThreads, floats * sizeof(float), "causal attention (tf32)",
             qkv, g, vector, out, lse);
    else
      launch(forward_kernel<D, drop_on, false>, s, kRows, kThreads, floats * sizeof(float), "causal attention (f32)",
             qkv, g, vector, out, lse);
  });
}

void backward_f32(const float* qkv, const float* out, const float* grad_out, const float* lse, const AttentionShape& s,
                  const AttentionDropout& drop, bool tf32, float* delta, float* grad_qkv) {
  const Geometry g = geometry_of(s, drop);
  const bool vector = s.head_dim % 4 == 0 && s.channels % 4 == 0 && aligned16(qkv) && aligned16(grad_out);
  dispatch_head(s.head_dim, drop.p > 0, [&](auto width, auto dropout) {
    constexpr int D = decltype(width)::value;
    constexpr bool drop_on = decltype(dropout)::value;
    const std::size_t dq_floats = 4 * kRows * kAcross<D> + kRows;
    const std::size_t dkdv_floats = 4 * kRows * kAcross<D> + 2 * kRows;
    const auto run = [&](auto fast) {
      constexpr bool kFast = decltype(fast)::value;
      launch(backward_dq_kernel<D, drop_on, kFast>, s, kRows, kThreads, dq_floats * sizeof(float),
             kFast ? "causal attention backward (tf32, dq)" : "causal attention backward (f32, dq)", qkv, out, grad_out,
             lse, g, vector, delta, grad_qkv);
      launch(backward_dkdv_kernel<D, drop_on, kFast>, s, kRows, kThreads, dkdv_floats * sizeof(float),
             kFast ? "causal attention backward (tf32, dk, dv)" : "causal attention backward (f32, dk, dv)", qkv,
             grad_out, lse, static_cast<const float*>(delta), g, vector, grad_qkv);
    };
    if (tf32)
      run(std::true_type{});
    else
      run(std::false_type{});
  });
}

}  // namespace troupe::tensor::cuda_backend::attention
