#include "troupe/tensor/attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "host_gemm.hpp"
#include "math_loops.hpp"
#include "philox.hpp"
#include "troupe/error.hpp"

namespace troupe::tensor {

namespace {

constexpr std::int64_t kMaxCudaHeadDim = 128;

struct Dims {
  std::int64_t batch, time, channels, heads, head_dim;
};

Dims check_qkv(const Tensor& qkv, std::int64_t n_head, const char* op) {
  TROUPE_CHECK(qkv.defined() && qkv.dim() == 3, op, ": qkv must be [B, T, 3C], got ",
               qkv.defined() ? to_string(qkv.shape()) : std::string("an undefined tensor"));
  TROUPE_CHECK(qkv.dtype() == DType::f32 || qkv.dtype() == DType::f64 || qkv.dtype() == DType::bf16, op,
               ": qkv must be f32, f64 or bf16, got ", qkv.dtype());
  const std::int64_t three_c = qkv.size(2);
  TROUPE_CHECK(three_c % 3 == 0, op, ": qkv's last dimension (", three_c, ") is not 3C");
  const std::int64_t c = three_c / 3;
  TROUPE_CHECK(n_head > 0 && c % n_head == 0, op, ": n_head ", n_head, " does not divide the embedding size ", c);
  TROUPE_CHECK(qkv.device().is_cpu() || c / n_head <= kMaxCudaHeadDim, op, ": head size ", c / n_head, " (n_embd ", c,
               " / n_head ", n_head, ") is above the ", kMaxCudaHeadDim, " the CUDA kernels hold");
  return {qkv.size(0), qkv.size(1), c, n_head, c / n_head};
}

// The statistics' dtype: f64 for f64 tensors, f32 for the others.
DType statistics_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

cuda_backend::AttentionShape shape_of(const Dims& d) { return {d.batch, d.time, d.channels, d.heads, d.head_dim}; }

void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, double beta, float* c, std::int64_t ldc) {
  detail::sgemm(ta, tb, m, n, k, static_cast<float>(alpha), a, lda, b, ldb, static_cast<float>(beta), c, ldc);
}
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* a,
          std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

// The dropout multiplier of score (row, col) of head `bh`: 0 or 1/keep. One Philox
// word per score of the full T x T square, so the position alone picks the word.
template <class T>
struct DropoutMask {
  double p = 0;
  std::uint64_t seed = 0, offset = 0;
  std::int64_t time = 0;

  bool active() const { return p > 0; }
  // Fills z[0..cols) for one row.
  void row(std::int64_t bh, std::int64_t i, std::int64_t cols, T* z) const {
    const float keep = static_cast<float>(1.0 - p);
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const std::uint64_t first = static_cast<std::uint64_t>((bh * time + i) * time);
    for (std::int64_t j = 0; j < cols; ++j) {
      const float u = static_cast<float>(detail::philox_uniform(seed, offset, first + static_cast<std::uint64_t>(j)));
      z[j] = u < keep ? scale : T(0);
    }
  }
};

// One Philox word per score of the full T x T square of every head.
void reserve_dropout(AttentionForward& f, const Dims& d, double dropout_p, Generator& gen) {
  f.dropout_p = dropout_p;
  if (dropout_p > 0) {
    f.seed = gen.seed();
    f.offset = gen.reserve(static_cast<std::uint64_t>((d.batch * d.heads * d.time * d.time + 3) / 4));
  }
}

// Softmax rows: f32 through the vectorised loops (math_loops.hpp), f64 here.
float softmax_row(float* s, std::int64_t n) { return detail::math_loops()->softmax_row(s, n); }
double softmax_row(double* s, std::int64_t n) {
  double m = s[0];
  for (std::int64_t j = 1; j < n; ++j) m = std::max(m, s[j]);
  double sum = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  const double inv = 1 / sum;
  for (std::int64_t j = 0; j < n; ++j) s[j] *= inv;
  return m + std::log(sum);
}
void exp_shifted(float* s, std::int64_t n, float shift) { detail::math_loops()->exp_shifted(s, n, shift); }
void exp_shifted(double* s, std::int64_t n, double shift) {
  for (std::int64_t j = 0; j < n; ++j) s[j] = std::exp(s[j] - shift);
}
void softmax_backward_row(const float* p, float* dp, std::int64_t n) {
  detail::math_loops()->softmax_backward_row(p, dp, n);
}
void softmax_backward_row(const double* p, double* dp, std::int64_t n) {
  double dot = 0;
  for (std::int64_t j = 0; j < n; ++j) dot += p[j] * dp[j];
  for (std::int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - dot);
}

// The scores are computed in blocks of kBlock query rows, each against only the keys
// up to its last row: the causal mask's upper triangle is never multiplied, which
// takes the attention's matrix products to 5/8 of the full square at T = 256. Columns
// past a block's end are never written or read.
constexpr std::int64_t kBlock = 64;

// Whether the CPU forward keeps P for the backward: when it is at most twice the size
// of qkv (n_head T <= 6 C, i.e. T <= 6 D). Recomputing P costs a third of the forward's
// products and an exp per score; keeping it costs memory that grows as T^2.
bool keeps_probs(const Dims& d) { return d.heads * d.time <= 6 * d.channels; }

template <class T>
AttentionForward forward_cpu(const Tensor& qkv, const Dims& d, double dropout_p, Generator& gen) {
  const std::int64_t B = d.batch, L = d.time, C = d.channels, H = d.heads, D = d.head_dim;
  AttentionForward f;
  f.out = Tensor::empty({B, L, C}, qkv.dtype());
  f.log_sum_exp = Tensor::empty({B, H, L}, qkv.dtype());
  if (keeps_probs(d)) f.probs = Tensor::empty({B, H, L, L}, qkv.dtype());
  reserve_dropout(f, d, dropout_p, gen);
  const DropoutMask<T> mask{dropout_p, f.seed, f.offset, L};
  const T* base = qkv.data<T>();
  T* out = f.out.data<T>();
  T* lse = f.log_sum_exp.data<T>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto square = static_cast<std::size_t>(L * L);
  std::vector<T> scratch(f.probs.defined() ? 0 : square), dropped(mask.active() ? square : 0),
      z(static_cast<std::size_t>(L));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      const T* q = base + b * L * 3 * C + h * D;
      const T* k = q + C;
      const T* v = q + 2 * C;
      T* row_lse = lse + (b * H + h) * L;
      T* p = f.probs.defined() ? f.probs.data<T>() + (b * H + h) * L * L : scratch.data();
      for (std::int64_t r0 = 0; r0 < L; r0 += kBlock) {
        const std::int64_t r1 = std::min(L, r0 + kBlock);
        gemm(false, true, r1 - r0, r1, D, scale, q + r0 * 3 * C, 3 * C, k, 3 * C, 0.0, p + r0 * L, L);
        for (std::int64_t i = r0; i < r1; ++i) {
          T* s = p + i * L;
          row_lse[i] = softmax_row(s, i + 1);
          std::fill(s + i + 1, s + r1, T(0));
        }
        // Dropout goes to a copy: a kept P is the one before dropout.
        const T* used = p;
        if (mask.active()) {
          for (std::int64_t i = r0; i < r1; ++i) {
            mask.row(b * H + h, i, i + 1, z.data());
            T* dst = dropped.data() + i * L;
            for (std::int64_t j = 0; j <= i; ++j) dst[j] = p[i * L + j] * z[static_cast<std::size_t>(j)];
            std::fill(dst + i + 1, dst + r1, T(0));
          }
          used = dropped.data();
        }
        gemm(false, false, r1 - r0, D, r1, 1.0, used + r0 * L, L, v, 3 * C, 0.0, out + (b * L + r0) * C + h * D, C);
      }
    }
  }
  return f;
}

template <class T>
Tensor backward_cpu(const Tensor& grad_out, const Tensor& qkv, const AttentionForward& f, const Dims& d) {
  const std::int64_t B = d.batch, L = d.time, C = d.channels, H = d.heads, D = d.head_dim;
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype());
  const DropoutMask<T> mask{f.dropout_p, f.seed, f.offset, L};
  const T* base = qkv.data<T>();
  const T* gy = grad_out.data<T>();
  const T* lse = f.log_sum_exp.data<T>();
  T* dbase = dqkv.data<T>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto square = static_cast<std::size_t>(L * L);
  const bool kept = f.probs.defined();
  std::vector<T> scratch(kept ? 0 : square), dp(square), dropped(mask.active() ? square : 0),
      z(static_cast<std::size_t>(L));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      const T* q = base + b * L * 3 * C + h * D;
      const T* k = q + C;
      const T* v = q + 2 * C;
      const T* dout = gy + b * L * C + h * D;
      T* dq = dbase + b * L * 3 * C + h * D;
      T* dk = dq + C;
      T* dv = dq + 2 * C;
      const T* row_lse = lse + (b * H + h) * L;
      const T* p = kept ? f.probs.data<T>() + (b * H + h) * L * L : scratch.data();
      for (std::int64_t r0 = 0; r0 < L; r0 += kBlock) {
        const std::int64_t r1 = std::min(L, r0 + kBlock);
        if (!kept) {  // P again, from the saved log-sum-exp: exp(S - lse), zero above the diagonal.
          gemm(false, true, r1 - r0, r1, D, scale, q + r0 * 3 * C, 3 * C, k, 3 * C, 0.0, scratch.data() + r0 * L, L);
          for (std::int64_t i = r0; i < r1; ++i) {
            T* s = scratch.data() + i * L;
            exp_shifted(s, i + 1, row_lse[i]);
            std::fill(s + i + 1, s + r1, T(0));
          }
        }
        // dP = dy v^T, then through the dropout: dP *= Z, and dv (below) = (P Z)^T dy.
        gemm(false, true, r1 - r0, r1, D, 1.0, dout + r0 * C, C, v, 3 * C, 0.0, dp.data() + r0 * L, L);
        if (mask.active()) {
          for (std::int64_t i = r0; i < r1; ++i) {
            mask.row(b * H + h, i, r1, z.data());
            for (std::int64_t j = 0; j < r1; ++j) {
              const T zj = j <= i ? z[static_cast<std::size_t>(j)] : T(0);
              dropped[static_cast<std::size_t>(i * L + j)] = p[i * L + j] * zj;
              dp[static_cast<std::size_t>(i * L + j)] *= zj;
            }
          }
        }
        // dS = P (dP - rowsum(P dP)): the softmax's Jacobian applied per row.
        for (std::int64_t i = r0; i < r1; ++i) {
          T* di = dp.data() + i * L;
          softmax_backward_row(p + i * L, di, i + 1);
          std::fill(di + i + 1, di + r1, T(0));
        }
        gemm(false, false, r1 - r0, D, r1, scale, dp.data() + r0 * L, L, k, 3 * C, 0.0, dq + r0 * 3 * C, 3 * C);
      }
      // dv and dk of a block of keys take the rows from that block's first on: the
      // rows above it have no score for these keys.
      const T* p_used = mask.active() ? dropped.data() : p;
      for (std::int64_t c0 = 0; c0 < L; c0 += kBlock) {
        const std::int64_t c1 = std::min(L, c0 + kBlock);
        gemm(true, false, c1 - c0, D, L - c0, 1.0, p_used + c0 * L + c0, L, dout + c0 * C, C, 0.0, dv + c0 * 3 * C,
             3 * C);
        gemm(true, false, c1 - c0, D, L - c0, scale, dp.data() + c0 * L + c0, L, q + c0 * 3 * C, 3 * C, 0.0,
             dk + c0 * 3 * C, 3 * C);
      }
    }
  }
  return dqkv;
}

}  // namespace

AttentionForward causal_attention_forward(const Tensor& qkv, std::int64_t n_head, double dropout_p, Generator& gen) {
  const Dims d = check_qkv(qkv, n_head, "causal_attention_forward");
  TROUPE_CHECK(dropout_p >= 0 && dropout_p < 1, "causal_attention_forward: dropout must be in [0, 1), got ", dropout_p);
  if (qkv.device().is_cuda()) {
    AttentionForward f;
    f.out = Tensor::empty({d.batch, d.time, d.channels}, qkv.dtype(), qkv.device());
    f.log_sum_exp = Tensor::empty({d.batch, d.heads, d.time}, statistics_dtype(qkv.dtype()), qkv.device());
    reserve_dropout(f, d, dropout_p, gen);
    if (qkv.numel() > 0)
      cuda_backend::attention_forward(qkv.dtype(), qkv.raw_data(), shape_of(d), {f.dropout_p, f.seed, f.offset},
                                      f.out.raw_data(), f.log_sum_exp.raw_data());
    return f;
  }
  if (qkv.dtype() == DType::f64) return forward_cpu<double>(qkv, d, dropout_p, gen);
  if (qkv.dtype() == DType::f32) return forward_cpu<float>(qkv, d, dropout_p, gen);
  // bf16 on the CPU: computed in f32, the output rounded back (as the CUDA kernels do).
  AttentionForward f = forward_cpu<float>(qkv.to(DType::f32), d, dropout_p, gen);
  f.out = f.out.to(qkv.dtype());
  return f;
}

Tensor causal_attention_backward(const Tensor& grad_out, const Tensor& qkv, const AttentionForward& forward,
                                 std::int64_t n_head) {
  const Dims d = check_qkv(qkv, n_head, "causal_attention_backward");
  TROUPE_CHECK(
      grad_out.defined() && grad_out.dtype() == qkv.dtype() && grad_out.shape() == Shape({d.batch, d.time, d.channels}),
      "causal_attention_backward: grad_out must be ", qkv.dtype(), " ", to_string(Shape({d.batch, d.time, d.channels})),
      ", got ", grad_out.defined() ? to_string(grad_out.shape()) : std::string("an undefined tensor"));
  TROUPE_CHECK(forward.log_sum_exp.defined() && forward.log_sum_exp.shape() == Shape({d.batch, d.heads, d.time}) &&
                   forward.log_sum_exp.dtype() == statistics_dtype(qkv.dtype()),
               "causal_attention_backward: the forward's saved statistics do not match qkv ", to_string(qkv.shape()),
               " ", qkv.dtype());
  TROUPE_CHECK(grad_out.device() == qkv.device() && forward.log_sum_exp.device() == qkv.device(),
               "causal_attention_backward: qkv is on ", qkv.device(), ", grad_out on ", grad_out.device(),
               ", the forward's statistics on ", forward.log_sum_exp.device());
  TROUPE_CHECK(!forward.probs.defined() ||
                   (forward.probs.shape() == Shape({d.batch, d.heads, d.time, d.time}) &&
                    forward.probs.dtype() == statistics_dtype(qkv.dtype()) && forward.probs.device() == qkv.device()),
               "causal_attention_backward: the forward's kept probabilities do not match qkv ", to_string(qkv.shape()),
               " ", qkv.dtype());
  if (qkv.device().is_cuda()) {
    TROUPE_CHECK(
        forward.out.defined() && forward.out.shape() == grad_out.shape() && forward.out.device() == qkv.device(),
        "causal_attention_backward: the forward's output is missing (CUDA's backward reads it)");
    Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
    Tensor delta = Tensor::empty({d.batch, d.heads, d.time}, statistics_dtype(qkv.dtype()), qkv.device());
    if (qkv.numel() > 0)
      cuda_backend::attention_backward(
          qkv.dtype(), qkv.raw_data(), forward.out.raw_data(), grad_out.raw_data(), forward.log_sum_exp.raw_data(),
          shape_of(d), {forward.dropout_p, forward.seed, forward.offset}, delta.raw_data(), dqkv.raw_data());
    return dqkv;
  }
  if (qkv.dtype() == DType::f64) return backward_cpu<double>(grad_out, qkv, forward, d);
  if (qkv.dtype() == DType::f32) return backward_cpu<float>(grad_out, qkv, forward, d);
  return backward_cpu<float>(grad_out.to(DType::f32), qkv.to(DType::f32), forward, d).to(qkv.dtype());
}

}  // namespace troupe::tensor
