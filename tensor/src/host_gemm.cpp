// detail::sgemm: troupe's AVX-512 f32 product, blocked as BLIS and GotoBLAS block it.
//
// c is cut into tiles of kMr rows x kNr columns (12 x 32: 24 of the 32 ZMM registers
// accumulate, two hold a row of b). k runs in blocks of kKc: a block of op(b), kKc x up
// to kNc columns, is packed once into panels of kNr columns (a panel, 32 KB, stays in
// L1 while the tiles under it run) and a block of op(a), up to kMc rows x kKc, into
// panels of kMr rows (in L2). Packing pads partial panels with zeros, so every tile
// runs the same loop and edges only mask their loads and stores of c.
//
// Each element of c sums its products in k order within a block, starting from zero,
// with one FMA per product; blocks add into c in order. Nothing in that order depends
// on m, n, strides or the tile an element falls in (host_gemm.hpp's promise).
#include "host_gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "avx512_target.hpp"
#include "convert.hpp"
#include "troupe/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TROUPE_HOST_GEMM_AVX512 1
#endif

namespace troupe::tensor::detail {

namespace {

using i64 = std::int64_t;

#ifdef TROUPE_HOST_GEMM_AVX512

constexpr i64 kMr = 12, kNr = 32, kKc = 256, kMc = 144, kNc = 3072;
// A product with beta 0 whose k fits one block writes each element of c once and never
// reads it; past this size c would not stay in cache either, so full tiles go straight
// to memory (non-temporal stores), sparing the read each cache line's first write costs.
// A weight gradient of 4096 x 4096 over a batch of 32 ran 1.9x faster with them.
constexpr double kStreamBytes = 16.0 * (1 << 20);

// A thread's packing buffer, b's block then a's, grown to the largest pair of blocks
// seen (at most kKc x (kNc + kMc) floats, 3.3 MB) and kept for the next product.
struct Scratch {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> buffer;
  i64 capacity = 0;

  float* get(i64 floats) {
    if (floats > capacity) {
      void* p = std::aligned_alloc(64, static_cast<std::size_t>(floats) * sizeof(float));
      TROUPE_CHECK(p != nullptr, "matmul: cannot allocate ", floats * 4, " bytes of packing buffer");
      buffer.reset(static_cast<float*>(p));
      capacity = floats;
    }
    return buffer.get();
  }
};

#define TROUPE_AVX512 TROUPE_AVX512_TARGET

// The first `count` of 16 lanes.
TROUPE_AVX512 inline __mmask16 first_lanes(i64 count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

// GCC 12's shuffle intrinsics pass _mm512_undefined_ps(), a self-initialised
// variable that -W(maybe-)uninitialized flags wherever they inline.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// r[c][i] = in[i][c] for i, c < 16, in registers: unpack pairs of rows, then 64- and
// 128-bit lanes, then halves (the usual three-stage 16 x 16 float transpose).
TROUPE_AVX512 inline void transpose16_in_registers(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
  }
}

// out[c ldo + r] = in[r ldi + c] for r, c < 16.
TROUPE_AVX512 inline void transpose16(const float* in, i64 ldi, float* out, i64 ldo) {
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * ldi);
  transpose16_in_registers(r);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + i * ldo, r[i]);
}

// op(b)[k0 .. k0+kc, j0 .. j0+nc] into panels of kNr columns: panel p holds kc rows of
// kNr floats at out + p kNr kc, columns past nc zero.
TROUPE_AVX512 void pack_b(bool tb, const float* b, i64 ldb, i64 k0, i64 kc, i64 j0, i64 nc, float* out) {
  if (!tb) {  // a row of b is a row of every panel: read each row once, in order
    for (i64 k = 0; k < kc; ++k) {
      const float* row = b + (k0 + k) * ldb + j0;
      for (i64 jp = 0; jp < nc; jp += kNr) {
        const i64 valid = std::min(kNr, nc - jp);
        float* panel_row = out + jp * kc + k * kNr;
        _mm512_store_ps(panel_row, _mm512_maskz_loadu_ps(first_lanes(valid), row + jp));
        _mm512_store_ps(panel_row + 16, _mm512_maskz_loadu_ps(first_lanes(valid - 16), row + jp + 16));
      }
    }
    return;
  }
  for (i64 jp = 0; jp < nc; jp += kNr) {
    const i64 valid = std::min(kNr, nc - jp);
    float* panel = out + jp * kc;
    // b is [n, k]: 16 of its rows at a time become 16 columns of the panel, 16
    // k-steps at a time as a 16 x 16 transpose; a partial panel and the last k-steps
    // go one by one.
    i64 k = 0;
    if (valid == kNr) {
      const float* rows = b + (j0 + jp) * ldb + k0;
      for (; k + 16 <= kc; k += 16) {
        transpose16(rows + k, ldb, panel + k * kNr, kNr);
        transpose16(rows + 16 * ldb + k, ldb, panel + k * kNr + 16, kNr);
      }
    }
    if (k == kc) continue;
    std::memset(panel + k * kNr, 0, static_cast<std::size_t>(kNr * (kc - k)) * sizeof(float));
    for (i64 j = 0; j < valid; ++j) {
      const float* row = b + (j0 + jp + j) * ldb + k0;
      for (i64 kk = k; kk < kc; ++kk) panel[kk * kNr + j] = row[kk];
    }
  }
}

// op(a)[i0 .. i0+mc, k0 .. k0+kc] into panels of kMr rows: panel p holds kc columns of
// kMr floats at out + p kMr kc, rows past mc zero.
TROUPE_AVX512 void pack_a(bool ta, const float* a, i64 lda, i64 i0, i64 mc, i64 k0, i64 kc, float* out) {
  for (i64 ip = 0; ip < mc; ip += kMr) {
    const i64 valid = std::min(kMr, mc - ip);
    float* panel = out + ip * kc;
    if (valid < kMr) std::memset(panel, 0, static_cast<std::size_t>(kMr * kc) * sizeof(float));
    if (ta) {  // a is [k, m]: a row of a gives one column of the panel
      for (i64 k = 0; k < kc; ++k)
        _mm512_mask_storeu_ps(panel + k * kMr, first_lanes(kMr),
                              _mm512_maskz_loadu_ps(first_lanes(valid), a + (k0 + k) * lda + i0 + ip));
    } else {  // a is [m, k]: reading kMr rows side by side writes the panel in order
      const float* rows = a + (i0 + ip) * lda + k0;
      // 16 k-steps at a time as a 16 x 16 transpose of the valid rows and zeros.
      i64 k = 0;
      for (; k + 16 <= kc; k += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = i < valid ? _mm512_loadu_ps(rows + i * lda + k) : _mm512_setzero_ps();
        transpose16_in_registers(r);
#pragma GCC unroll 16
        for (int kk = 0; kk < 16; ++kk) _mm512_mask_storeu_ps(panel + (k + kk) * kMr, first_lanes(kMr), r[kk]);
      }
      for (; k < kc; ++k)
        for (i64 i = 0; i < valid; ++i) panel[k * kMr + i] = rows[i * lda + k];
    }
  }
}

// acc[i][h] = the sum over k < kc of rows[k kMr + i] x lanes[k kNr + 16 h ..], from
// zero, one FMA a product in k order: every tile's arithmetic.
TROUPE_AVX512 inline void accumulate(i64 kc, const float* rows, const float* lanes, __m512 (&acc)[kMr][2]) {
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (i64 k = 0; k < kc; ++k) {
    const __m512 l0 = _mm512_load_ps(lanes + k * kNr), l1 = _mm512_load_ps(lanes + k * kNr + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kMr; ++i) {
      const __m512 x = _mm512_set1_ps(rows[k * kMr + i]);
      acc[i][0] = _mm512_fmadd_ps(x, l0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(x, l1, acc[i][1]);
    }
  }
}

// One tile: c[rows, cols] = (first ? beta c : c) + alpha (a panel x b panel), rows <=
// kMr and cols <= kNr of it stored; with `stream`, full rows on 64-byte boundaries
// bypass the cache (the same values: only the store differs).
TROUPE_AVX512 void tile(i64 kc, const float* ap, const float* bp, float* c, i64 ldc, i64 rows, i64 cols, float alpha,
                        float beta, bool first, bool stream) {
  __m512 acc[kMr][2];
  // c is read at the end: its lines arrive while the k loop runs (8% on 1024^3, where
  // every k-block after the first adds into c).
  if (!first || beta != 0)
    for (i64 i = 0; i < rows; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16), _MM_HINT_T0);
    }
  accumulate(kc, ap, bp, acc);
  const __mmask16 m0 = first_lanes(cols), m1 = first_lanes(cols - 16);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i) {
    if (i >= rows) break;
    float* row = c + i * ldc;
    __m512 r0 = _mm512_mul_ps(va, acc[i][0]), r1 = _mm512_mul_ps(va, acc[i][1]);
    if (!first) {
      r0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), r0);
      r1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), r1);
    } else if (beta != 0) {  // with beta 0, c is not read (it may hold NaNs)
      r0 = _mm512_add_ps(_mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m0, row)), r0);
      r1 = _mm512_add_ps(_mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16)), r1);
    }
    if (stream && cols == kNr && (reinterpret_cast<std::uintptr_t>(row) & 63) == 0) {
      _mm512_stream_ps(row, r0);
      _mm512_stream_ps(row + 16, r1);
    } else {
      _mm512_mask_storeu_ps(row, m0, r0);
      _mm512_mask_storeu_ps(row + 16, m1, r1);
    }
  }
}

// A product of few rows by a transposed b (a Linear's forward: x W^T over a small
// batch) runs with the roles of the operands swapped: b's rows are packed as a's
// panels are, and a's rows, transposed, as b's, so that the 16 lanes of a register run
// over rows of a and c's tile is stored transposed. The large operand is then packed
// a 12-row panel at a time, used from L1 at once, where the usual order packs a block
// of b (3 MB at k 256) that falls out of L2 before its tiles read it, and pads a batch
// of 32 rows to three 12-row panels. Each element of c is the same chain of FMAs, with
// the same k-blocks and epilogue, so its bits are those of the usual order.
constexpr i64 kSwapRows = 64;  // up to this many rows of op(a)

// c[0 .. cols, 0 .. rows] (transposed) from a tile of kMr rows of b x kNr rows of a.
TROUPE_AVX512 void tile_swapped(i64 kc, const float* bp, const float* ap, float* c, i64 ldc, i64 rows, i64 cols,
                                float alpha, float beta, bool first) {
  __m512 acc[kMr][2];
  accumulate(kc, bp, ap, acc);
  // acc[j][h] holds c[16 h .. 16 h + 16, j]: through a 16 x 32 buffer and two
  // transposes, row i of c's tile becomes 16 contiguous floats (kMr of them used).
  alignas(64) float sums[16][kNr];
  alignas(64) float rows_of_c[kNr][16];
#pragma GCC unroll 12
  for (int j = 0; j < kMr; ++j) {
    _mm512_store_ps(sums[j], acc[j][0]);
    _mm512_store_ps(sums[j] + 16, acc[j][1]);
  }
  for (int j = kMr; j < 16; ++j) {
    _mm512_store_ps(sums[j], _mm512_setzero_ps());
    _mm512_store_ps(sums[j] + 16, _mm512_setzero_ps());
  }
  transpose16(&sums[0][0], kNr, &rows_of_c[0][0], 16);
  transpose16(&sums[0][16], kNr, &rows_of_c[16][0], 16);
  const __mmask16 mask = first_lanes(rows);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (i64 i = 0; i < cols; ++i) {
    float* row = c + i * ldc;
    __m512 r = _mm512_mul_ps(va, _mm512_load_ps(rows_of_c[i]));
    if (!first)
      r = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, row), r);
    else if (beta != 0)  // with beta 0, c is not read (it may hold NaNs)
      r = _mm512_add_ps(_mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mask, row)), r);
    _mm512_mask_storeu_ps(row, mask, r);
  }
}

// c = alpha a b^T + beta c with a [m, k], m <= kSwapRows, b [n, k] (the order above).
TROUPE_AVX512 void sgemm_avx512_swapped(i64 m, i64 n, i64 k, float alpha, const float* a, i64 lda, const float* b,
                                        i64 ldb, float beta, float* c, i64 ldc) {
  thread_local Scratch scratch;
  const i64 a_floats = kKc * ((m + kNr - 1) / kNr * kNr);
  float* const a_pack = scratch.get(a_floats + kKc * kMr);
  float* const b_pack = a_pack + a_floats;
  for (i64 k0 = 0; k0 < k; k0 += kKc) {
    const i64 kc = std::min(kKc, k - k0);
    pack_b(true, a, lda, k0, kc, 0, m, a_pack);  // a^T in panels of kNr of a's rows
    for (i64 j0 = 0; j0 < n; j0 += kMr) {
      const i64 rows = std::min(kMr, n - j0);
      pack_a(false, b, ldb, j0, rows, k0, kc, b_pack);  // kMr of b's rows
      for (i64 i0 = 0; i0 < m; i0 += kNr)
        tile_swapped(kc, b_pack, a_pack + i0 * kc, c + i0 * ldc + j0, ldc, rows, std::min(kNr, m - i0), alpha, beta,
                     k0 == 0);
    }
  }
}

// Whether a product streams its stores (kStreamBytes): decided for the whole product,
// before any split into threads' bands.
bool streams(i64 m, i64 n, i64 k, float beta) {
  return beta == 0 && k <= kKc && static_cast<double>(m) * static_cast<double>(n) * sizeof(float) >= kStreamBytes;
}

TROUPE_AVX512 void sgemm_avx512(bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const float* a, i64 lda,
                                const float* b, i64 ldb, float beta, float* c, i64 ldc, bool stream) {
  if (!ta && tb && m <= kSwapRows) return sgemm_avx512_swapped(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  thread_local Scratch scratch;
  const i64 b_floats = kKc * ((std::min(kNc, n) + kNr - 1) / kNr * kNr);
  const i64 a_floats = kKc * ((std::min(kMc, m) + kMr - 1) / kMr * kMr);
  float* const b_pack = scratch.get(b_floats + a_floats);
  float* const a_pack = b_pack + b_floats;
  for (i64 j0 = 0; j0 < n; j0 += kNc) {
    const i64 nc = std::min(kNc, n - j0);
    for (i64 k0 = 0; k0 < k; k0 += kKc) {
      const i64 kc = std::min(kKc, k - k0);
      pack_b(tb, b, ldb, k0, kc, j0, nc, b_pack);
      for (i64 i0 = 0; i0 < m; i0 += kMc) {
        const i64 mc = std::min(kMc, m - i0);
        pack_a(ta, a, lda, i0, mc, k0, kc, a_pack);
        for (i64 jr = 0; jr < nc; jr += kNr)
          for (i64 ir = 0; ir < mc; ir += kMr)
            tile(kc, a_pack + ir * kc, b_pack + jr * kc, c + (i0 + ir) * ldc + j0 + jr, ldc, std::min(kMr, mc - ir),
                 std::min(kNr, nc - jr), alpha, beta, k0 == 0, stream);
      }
    }
  }
  if (stream) _mm_sfence();
}

#pragma GCC diagnostic pop
#undef TROUPE_AVX512

#endif  // TROUPE_HOST_GEMM_AVX512

bool avx512_runs() {
#ifdef TROUPE_HOST_GEMM_AVX512
  return cpu_has_avx512();
#else
  return false;
#endif
}

#ifdef TROUPE_HOST_GEMM_AVX512
// Below this many flops a product stays on the calling thread: starting threads costs
// tens of microseconds.
constexpr double kThreadedFlops = 1 << 25;

// The product cut into `threads` bands, of rows where op(a) is taller than op(b) is
// wide, else of columns, each band packing its own blocks on its own thread. An
// element's bits do not depend on its band, so they are those of one thread.
void sgemm_avx512_threaded(int threads, bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const float* a, i64 lda,
                           const float* b, i64 ldb, float beta, float* c, i64 ldc) {
  const bool by_rows = m >= n, stream = streams(m, n, k, beta);
  const i64 extent = by_rows ? m : n, unit = by_rows ? kMr : kNr, units = (extent + unit - 1) / unit;
  threads = static_cast<int>(std::min<i64>(threads, units));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  auto band = [&](int t) {
    const i64 begin = units * t / threads * unit, end = std::min(extent, units * (t + 1) / threads * unit);
    try {
      if (by_rows)
        sgemm_avx512(ta, tb, end - begin, n, k, alpha, ta ? a + begin : a + begin * lda, lda, b, ldb, beta,
                     c + begin * ldc, ldc, stream);
      else
        sgemm_avx512(ta, tb, m, end - begin, k, alpha, a, lda, tb ? b + begin * ldb : b + begin, ldb, beta, c + begin,
                     ldc, stream);
    } catch (...) {
      errors[static_cast<std::size_t>(t)] = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> others;
    for (int t = 1; t < threads; ++t) others.emplace_back(band, t);
    band(0);
  }
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
}
#endif

// What TROUPE_HOST_GEMM asks `best` to be: unset or "auto" leaves the choice to the
// CPU; "blas" or "avx512" pins it, so that nodes of a mixed cluster compute the same
// bits (docs/CLUSTER.md).
HostGemm best_from_environment() {
  static const HostGemm chosen = [] {
    const char* value = std::getenv("TROUPE_HOST_GEMM");
    const std::string v = value == nullptr ? "" : value;
    if (v.empty() || v == "auto") return avx512_runs() ? HostGemm::avx512 : HostGemm::blas;
    if (v == "blas") return HostGemm::blas;
    if (v == "avx512") return HostGemm::avx512;
    return HostGemm::best;  // refused below, at every call, with the value named
  }();
  TROUPE_CHECK(chosen != HostGemm::best, "TROUPE_HOST_GEMM=", std::getenv("TROUPE_HOST_GEMM"),
               ": expected auto, blas or avx512");
  TROUPE_CHECK(chosen != HostGemm::avx512 || avx512_runs(),
               "TROUPE_HOST_GEMM=avx512, but this CPU does not run AVX-512 (use auto or blas)");
  return chosen;
}

}  // namespace

bool host_gemm_available(HostGemm which) { return which != HostGemm::avx512 || avx512_runs(); }

void sgemm(bool ta, bool tb, i64 m, i64 n, i64 k, float alpha, const float* a, i64 lda, const float* b, i64 ldb,
           float beta, float* c, i64 ldc, HostGemm which) {
  TROUPE_CHECK(host_gemm_available(which), "matmul: the AVX-512 kernel does not run on this CPU");
  if (m == 0 || n == 0) return;
  if (which == HostGemm::best) which = best_from_environment();
  if (k == 0) {  // BLAS rejects a leading dimension of 0; the product is all zeros
    for (i64 i = 0; i < m; ++i)
      for (i64 j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.0f : beta * c[i * ldc + j];
    return;
  }
#ifdef TROUPE_HOST_GEMM_AVX512
  if (which == HostGemm::avx512) {
    const int threads = openblas_get_num_threads();  // what set_num_threads asked for
    if (threads > 1 && 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= kThreadedFlops)
      sgemm_avx512_threaded(threads, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
      sgemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, streams(m, n, k, beta));
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

}  // namespace troupe::tensor::detail
