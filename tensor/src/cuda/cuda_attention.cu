// Causal self-attention on CUDA for f64 (bf16 and f32 have the tensor-core kernels of
// cuda_attention_mma.cu and cuda_attention_tf32.cu), the flash-attention recipe (Dao
// et al., 2022) on CUDA cores:
// the T x T scores never reach global memory. A thread owns one row (a query in the
// forward and in dQ, a key in dK/dV) and keeps its accumulators in registers; a block
// of TILE threads walks the other side's rows in TILE-row tiles staged in shared
// memory, skipping the tiles the causal mask hides.
//
//   forward   online softmax per query row; writes y and the row's log-sum-exp
//   dq        per query row: delta = rowsum(dy * y), then dq from P recomputed
//   dkdv      per key row: dk and dv from P recomputed, delta read back
//
// The backward is two kernels rather than one because a single pass over key tiles
// would have to add dQ across blocks with atomics, whose order (and so whose bits)
// changes from run to run; troupe's resumed runs must end bit for bit where a straight
// run ends. Everything accumulates in the element type. Attention dropout
// draws the word of score (i, j) of head bh from Philox at (bh * T + i) * T + j, as
// the CPU does, so both devices drop the same weights.
#include "cuda_attention.cuh"

namespace troupe::tensor::cuda_backend {

namespace {

template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
// Rows per block (and threads per block): 32 for f64, whose tiles are twice the bytes.
template <class T>
constexpr int kTile = std::is_same_v<T, double> ? 32 : 64;

__device__ inline std::int64_t lesser(std::int64_t a, std::int64_t b) { return a < b ? a : b; }

using attention::dropout_factor;
using attention::Geometry;

// Rows [first, first + TILE) of one head's q, k or v (column offset `part` = 0, C or
// 2C of each qkv row) into tile[TILE][pitch] as A, zero past the sequence and past
// head_dim. Consecutive threads read consecutive columns of a row.
template <class T, int DMAX, class A>
__device__ inline void load_rows(const T* head, const Geometry& g, std::int64_t part, std::int64_t first, A* tile,
                                 int pitch) {
  constexpr int kRows = kTile<T>;
  const std::int64_t stride = 3 * g.channels;
  for (int e = threadIdx.x; e < kRows * DMAX; e += kRows) {
    const int r = e / DMAX, d = e % DMAX;
    const std::int64_t row = first + r;
    tile[r * pitch + d] =
        row < g.time && d < g.head_dim ? static_cast<A>(to_compute(head[row * stride + part + d])) : A(0);
  }
}

// a . b over DMAX elements in kChains interleaved partial sums: one running sum would
// be a chain of DMAX dependent FMAs, and with the few warps these register-heavy
// kernels fit on an SM, nothing would hide its latency.
constexpr int kChains = 4;
template <int DMAX, class A, class B>
__device__ __forceinline__ A dot(const A* a, const B& b) {
  A part[kChains] = {};
#pragma unroll
  for (int d = 0; d < DMAX; ++d) part[d % kChains] += a[d] * b[d];
  return (part[0] + part[1]) + (part[2] + part[3]);
}

template <class T, int DMAX, bool kDropout>
__global__ void __launch_bounds__(kTile<T>) forward_kernel(const T* qkv, Geometry g, T* out, Acc<T>* lse) {
  using A = Acc<T>;
  constexpr int kRows = kTile<T>;
  extern __shared__ unsigned char shared[];
  A* ks = reinterpret_cast<A*>(shared);
  A* vs = ks + kRows * DMAX;
  const std::int64_t bh = blockIdx.x, b = bh / g.heads, h = bh % g.heads;
  const std::int64_t L = g.time, C = g.channels, stride = 3 * C;
  const T* head = qkv + b * L * stride + h * g.head_dim;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kRows, i = first + threadIdx.x;
  const bool active = i < L;

  A q[DMAX], o[DMAX];
#pragma unroll
  for (int d = 0; d < DMAX; ++d) {
    q[d] = active && d < g.head_dim ? static_cast<A>(to_compute(head[i * stride + d])) : A(0);
    o[d] = 0;
  }
  A m = -INFINITY, l = 0;
  const A scale = static_cast<A>(g.scale);
  const std::int64_t last = lesser(L, first + kRows) - 1;
  for (std::int64_t k0 = 0; k0 <= last; k0 += kRows) {
    load_rows<T, DMAX>(head, g, C, k0, ks, DMAX);
    load_rows<T, DMAX>(head, g, 2 * C, k0, vs, DMAX);
    __syncthreads();
    const std::int64_t n = active ? lesser(kRows, i - k0 + 1) : 0;
    for (int r = 0; r < n; ++r) {
      A s = dot<DMAX>(ks + r * DMAX, q) * scale;
      if (s > m) {  // a new row maximum: rescale what was summed against the old one
        const A c = exp(m - s);
        l *= c;
#pragma unroll
        for (int d = 0; d < DMAX; ++d) o[d] *= c;
        m = s;
      }
      const A p = exp(s - m);
      l += p;
      const A weight = kDropout ? p * dropout_factor<A>(g, bh, i, k0 + r) : p;
#pragma unroll
      for (int d = 0; d < DMAX; ++d) o[d] += weight * vs[r * DMAX + d];
    }
    __syncthreads();
  }
  if (!active) return;
  const A inv = A(1) / l;
  T* y = out + (b * L + i) * C + h * g.head_dim;
#pragma unroll
  for (int d = 0; d < DMAX; ++d)
    if (d < g.head_dim) y[d] = convert_to<T>(o[d] * inv);
  lse[bh * L + i] = m + log(l);
}

template <class T, int DMAX, bool kDropout>
__global__ void __launch_bounds__(kTile<T>)
    backward_dq_kernel(const T* qkv, const T* out, const T* grad_out, const Acc<T>* lse, Geometry g, Acc<T>* delta,
                       T* grad_qkv) {
  using A = Acc<T>;
  constexpr int kRows = kTile<T>;
  extern __shared__ unsigned char shared[];
  A* ks = reinterpret_cast<A*>(shared);
  A* vs = ks + kRows * DMAX;
  const std::int64_t bh = blockIdx.x, b = bh / g.heads, h = bh % g.heads;
  const std::int64_t L = g.time, C = g.channels, stride = 3 * C;
  const T* head = qkv + b * L * stride + h * g.head_dim;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kRows, i = first + threadIdx.x;
  const bool active = i < L;

  A q[DMAX], dy[DMAX], dq[DMAX];
  A row_delta = 0;
  const std::int64_t out_row = (b * L + i) * C + h * g.head_dim;
#pragma unroll
  for (int d = 0; d < DMAX; ++d) {
    const bool in = active && d < g.head_dim;
    q[d] = in ? static_cast<A>(to_compute(head[i * stride + d])) : A(0);
    dy[d] = in ? static_cast<A>(to_compute(grad_out[out_row + d])) : A(0);
    if (in) row_delta += dy[d] * static_cast<A>(to_compute(out[out_row + d]));
    dq[d] = 0;
  }
  if (active) delta[bh * L + i] = row_delta;
  const A row_lse = active ? lse[bh * L + i] : A(0);
  const A scale = static_cast<A>(g.scale);
  const std::int64_t last = lesser(L, first + kRows) - 1;
  for (std::int64_t k0 = 0; k0 <= last; k0 += kRows) {
    load_rows<T, DMAX>(head, g, C, k0, ks, DMAX);
    load_rows<T, DMAX>(head, g, 2 * C, k0, vs, DMAX);
    __syncthreads();
    const std::int64_t n = active ? lesser(kRows, i - k0 + 1) : 0;
    for (int r = 0; r < n; ++r) {
      const A s = dot<DMAX>(ks + r * DMAX, q);
      A dp = dot<DMAX>(vs + r * DMAX, dy);
      const A p = exp(s * scale - row_lse);
      if (kDropout) dp *= dropout_factor<A>(g, bh, i, k0 + r);
      const A ds = p * (dp - row_delta);
#pragma unroll
      for (int d = 0; d < DMAX; ++d) dq[d] += ds * ks[r * DMAX + d];
    }
    __syncthreads();
  }
  if (!active) return;
  T* gq = grad_qkv + (b * L + i) * stride + h * g.head_dim;
#pragma unroll
  for (int d = 0; d < DMAX; ++d)
    if (d < g.head_dim) gq[d] = convert_to<T>(dq[d] * scale);
}

template <class T, int DMAX, bool kDropout>
__global__ void __launch_bounds__(kTile<T>) backward_dkdv_kernel(const T* qkv, const T* grad_out, const Acc<T>* lse,
                                                                 const Acc<T>* delta, Geometry g, T* grad_qkv) {
  using A = Acc<T>;
  constexpr int kRows = kTile<T>, kPitch = DMAX + 1;  // own rows padded: thread t reads row t, bank t
  extern __shared__ unsigned char shared[];
  A* k_own = reinterpret_cast<A*>(shared);
  A* v_own = k_own + kRows * kPitch;
  A* qs = v_own + kRows * kPitch;
  A* dys = qs + kRows * DMAX;
  A* lse_s = dys + kRows * DMAX;
  A* delta_s = lse_s + kRows;
  const std::int64_t bh = blockIdx.x, b = bh / g.heads, h = bh % g.heads;
  const std::int64_t L = g.time, C = g.channels, stride = 3 * C;
  const T* head = qkv + b * L * stride + h * g.head_dim;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * kRows, j = first + threadIdx.x;
  const bool active = j < L;
  load_rows<T, DMAX>(head, g, C, first, k_own, kPitch);
  load_rows<T, DMAX>(head, g, 2 * C, first, v_own, kPitch);
  const A* k = k_own + threadIdx.x * kPitch;
  const A* v = v_own + threadIdx.x * kPitch;

  A dk[DMAX], dv[DMAX];
#pragma unroll
  for (int d = 0; d < DMAX; ++d) dk[d] = dv[d] = 0;
  const A scale = static_cast<A>(g.scale);
  // Query rows before the block's first key see none of its keys.
  for (std::int64_t q0 = first; q0 < L; q0 += kRows) {
    __syncthreads();  // the previous tile is consumed (and, the first time, the own rows are in)
    for (int e = threadIdx.x; e < kRows * DMAX; e += kRows) {
      const int r = e / DMAX, d = e % DMAX;
      const std::int64_t row = q0 + r;
      const bool in = row < L && d < g.head_dim;
      qs[e] = in ? static_cast<A>(to_compute(head[row * stride + d])) : A(0);
      dys[e] = in ? static_cast<A>(to_compute(grad_out[(b * L + row) * C + h * g.head_dim + d])) : A(0);
    }
    {
      const std::int64_t row = q0 + threadIdx.x;
      lse_s[threadIdx.x] = row < L ? lse[bh * L + row] : A(0);
      delta_s[threadIdx.x] = row < L ? delta[bh * L + row] : A(0);
    }
    __syncthreads();
    if (!active) continue;
    const std::int64_t begin = j > q0 ? j - q0 : 0, end = lesser(kRows, L - q0);
    for (std::int64_t r = begin; r < end; ++r) {
      const A* qr = qs + r * DMAX;
      const A* dyr = dys + r * DMAX;
      const A s = dot<DMAX>(qr, k);
      A dp = dot<DMAX>(dyr, v);
      const A p = exp(s * scale - lse_s[r]);
      A weight = p;
      if constexpr (kDropout) {
        const A z = dropout_factor<A>(g, bh, q0 + r, j);
        weight *= z;
        dp *= z;
      }
      const A ds = p * (dp - delta_s[r]);
#pragma unroll
      for (int d = 0; d < DMAX; ++d) {
        dv[d] += weight * dyr[d];
        dk[d] += ds * qr[d];
      }
    }
  }
  if (!active) return;
  T* gk = grad_qkv + (b * L + j) * stride + C + h * g.head_dim;
  T* gv = gk + C;
#pragma unroll
  for (int d = 0; d < DMAX; ++d)
    if (d < g.head_dim) {
      gk[d] = convert_to<T>(dk[d] * scale);
      gv[d] = convert_to<T>(dv[d]);
    }
}

// Calls body(T{}, integral_constant<int, DMAX>{}, bool_constant<dropout>{}) for the
// dtype (f64) and the smallest of 32, 64, 128 that holds head_dim. The
// dropout flag is a template argument because Philox inlined into the loops pushes
// the register accumulators out to local memory: only dropout's kernels pay that.
template <class Body>
void dispatch_attention(DType dtype, std::int64_t head_dim, bool dropout, const char* what, Body&& body) {
  const auto by_dropout = [&](auto tag, auto width) {
    if (dropout)
      body(tag, width, std::true_type{});
    else
      body(tag, width, std::false_type{});
  };
  const auto by_width = [&](auto tag) {
    if (head_dim <= 32)
      by_dropout(tag, std::integral_constant<int, 32>{});
    else if (head_dim <= 64)
      by_dropout(tag, std::integral_constant<int, 64>{});
    else
      by_dropout(tag, std::integral_constant<int, 128>{});
  };
  switch (dtype) {
    case DType::f64: return by_width(double{});
    default: TROUPE_THROW(InvalidArgument, what, ": f32, f64 or bf16 on CUDA, got ", dtype_name(dtype));
  }
}

}  // namespace

void attention_forward(DType dtype, const void* qkv, const AttentionShape& s, const AttentionDropout& drop, void* out,
                       void* lse) {
  if (dtype == DType::bf16) {
    attention::forward_bf16(static_cast<const BFloat16*>(qkv), s, drop, static_cast<BFloat16*>(out),
                            static_cast<float*>(lse));
    return;
  }
  if (dtype == DType::f32) {
    attention::forward_f32(static_cast<const float*>(qkv), s, drop, allow_tf32(), static_cast<float*>(out),
                           static_cast<float*>(lse));
    return;
  }
  const Geometry g = attention::geometry_of(s, drop);
  dispatch_attention(dtype, s.head_dim, drop.p > 0, "causal attention", [&](auto tag, auto width, auto dropout) {
    using T = decltype(tag);
    using A = Acc<T>;
    constexpr int DMAX = decltype(width)::value, rows = kTile<T>;
    constexpr bool drop_on = decltype(dropout)::value;
    attention::launch(forward_kernel<T, DMAX, drop_on>, s, rows, rows, 2 * rows * DMAX * sizeof(A), "causal attention",
                      static_cast<const T*>(qkv), g, static_cast<T*>(out), static_cast<A*>(lse));
  });
}

void attention_backward(DType dtype, const void* qkv, const void* out, const void* grad_out, const void* lse,
                        const AttentionShape& s, const AttentionDropout& drop, void* delta, void* grad_qkv) {
  if (dtype == DType::bf16) {
    attention::backward_bf16(static_cast<const BFloat16*>(qkv), static_cast<const BFloat16*>(out),
                             static_cast<const BFloat16*>(grad_out), static_cast<const float*>(lse), s, drop,
                             static_cast<float*>(delta), static_cast<BFloat16*>(grad_qkv));
    return;
  }
  if (dtype == DType::f32) {
    attention::backward_f32(static_cast<const float*>(qkv), static_cast<const float*>(out),
                            static_cast<const float*>(grad_out), static_cast<const float*>(lse), s, drop, allow_tf32(),
                            static_cast<float*>(delta), static_cast<float*>(grad_qkv));
    return;
  }
  const Geometry g = attention::geometry_of(s, drop);
  dispatch_attention(
      dtype, s.head_dim, drop.p > 0, "causal attention backward", [&](auto tag, auto width, auto dropout) {
        using T = decltype(tag);
        using A = Acc<T>;
        constexpr int DMAX = decltype(width)::value, rows = kTile<T>;
        constexpr bool drop_on = decltype(dropout)::value;
        const auto* q = static_cast<const T*>(qkv);
        const auto* gy = static_cast<const T*>(grad_out);
        const auto* l = static_cast<const A*>(lse);
        auto* dl = static_cast<A*>(delta);
        auto* gq = static_cast<T*>(grad_qkv);
        attention::launch(backward_dq_kernel<T, DMAX, drop_on>, s, rows, rows, 2 * rows * DMAX * sizeof(A),
                          "causal attention backward (dq)", q, static_cast<const T*>(out), gy, l, g, dl, gq);
        attention::launch(backward_dkdv_kernel<T, DMAX, drop_on>, s, rows, rows,
                          (2 * rows * (DMAX + 1) + 2 * rows * DMAX + 2 * rows) * sizeof(A),
                          "causal attention backward (dk, dv)", q, gy, l, static_cast<const A*>(dl), g, gq);
      });
}

}  // namespace troupe::tensor::cuda_backend
