#include "troupe/tensor/attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "philox.hpp"
#include "troupe/error.hpp"

namespace troupe::tensor {

namespace {

struct Dims {
  std::int64_t batch, time, channels, heads, head_dim;
};

Dims check_qkv(const Tensor& qkv, std::int64_t n_head, const char* op) {
  TROUPE_CHECK(qkv.defined() && qkv.dim() == 3, op, ": qkv must be [B, T, 3C], got ",
               qkv.defined() ? to_string(qkv.shape()) : std::string("an undefined tensor"));
  TROUPE_CHECK(qkv.dtype() == DType::f32 || qkv.dtype() == DType::f64, op, ": qkv must be f32 or f64, got ",
               qkv.dtype());
  TROUPE_CHECK(!qkv.device().is_cuda(), op, ": attention on CUDA is not implemented yet (CPU only)");
  const std::int64_t three_c = qkv.size(2);
  TROUPE_CHECK(three_c % 3 == 0, op, ": qkv's last dimension (", three_c, ") is not 3C");
  const std::int64_t c = three_c / 3;
  TROUPE_CHECK(n_head > 0 && c % n_head == 0, op, ": n_head ", n_head, " does not divide the embedding size ", c);
  return {qkv.size(0), qkv.size(1), c, n_head, c / n_head};
}

void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, double beta, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), static_cast<float>(alpha), a, static_cast<int>(lda), b,
              static_cast<int>(ldb), static_cast<float>(beta), c, static_cast<int>(ldc));
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

template <class T>
AttentionForward forward_cpu(const Tensor& qkv, const Dims& d, double dropout_p, Generator& gen) {
  const std::int64_t B = d.batch, L = d.time, C = d.channels, H = d.heads, D = d.head_dim;
  AttentionForward f;
  f.out = Tensor::empty({B, L, C}, qkv.dtype());
  f.log_sum_exp = Tensor::empty({B, H, L}, qkv.dtype());
  f.dropout_p = dropout_p;
  if (dropout_p > 0) {
    f.seed = gen.seed();
    f.offset = gen.reserve(static_cast<std::uint64_t>((B * H * L * L + 3) / 4));
  }
  const DropoutMask<T> mask{dropout_p, f.seed, f.offset, L};
  const T* base = qkv.data<T>();
  T* out = f.out.data<T>();
  T* lse = f.log_sum_exp.data<T>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<T> p(static_cast<std::size_t>(L * L)), z(static_cast<std::size_t>(L));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      const T* q = base + b * L * 3 * C + h * D;
      const T* k = q + C;
      const T* v = q + 2 * C;
      gemm(false, true, L, L, D, scale, q, 3 * C, k, 3 * C, 0.0, p.data(), L);
      T* row_lse = lse + (b * H + h) * L;
      for (std::int64_t i = 0; i < L; ++i) {
        T* s = p.data() + i * L;
        T m = s[0];
        for (std::int64_t j = 1; j <= i; ++j) m = std::max(m, s[j]);
        T sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          s[j] = std::exp(s[j] - m);
          sum += s[j];
        }
        const T inv = T(1) / sum;
        for (std::int64_t j = 0; j <= i; ++j) s[j] *= inv;
        std::fill(s + i + 1, s + L, T(0));
        row_lse[i] = m + std::log(sum);
        if (mask.active()) {
          mask.row(b * H + h, i, i + 1, z.data());
          for (std::int64_t j = 0; j <= i; ++j) s[j] *= z[static_cast<std::size_t>(j)];
        }
      }
      gemm(false, false, L, D, L, 1.0, p.data(), L, v, 3 * C, 0.0, out + b * L * C + h * D, C);
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
  std::vector<T> p(square), dp(square), dropped(mask.active() ? square : 0), z(static_cast<std::size_t>(L));
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
      // P again, from the saved log-sum-exp: exp(S - lse), zero above the diagonal.
      gemm(false, true, L, L, D, scale, q, 3 * C, k, 3 * C, 0.0, p.data(), L);
      for (std::int64_t i = 0; i < L; ++i) {
        T* s = p.data() + i * L;
        for (std::int64_t j = 0; j <= i; ++j) s[j] = std::exp(s[j] - row_lse[i]);
        std::fill(s + i + 1, s + L, T(0));
      }
      // dP = dy v^T, then through the dropout: dP *= Z, and dv = (P Z)^T dy.
      gemm(false, true, L, L, D, 1.0, dout, C, v, 3 * C, 0.0, dp.data(), L);
      const T* p_used = p.data();
      if (mask.active()) {
        for (std::int64_t i = 0; i < L; ++i) {
          mask.row(b * H + h, i, L, z.data());
          for (std::int64_t j = 0; j < L; ++j) {
            const T zj = j <= i ? z[static_cast<std::size_t>(j)] : T(0);
            dropped[static_cast<std::size_t>(i * L + j)] = p[static_cast<std::size_t>(i * L + j)] * zj;
            dp[static_cast<std::size_t>(i * L + j)] *= zj;
          }
        }
        p_used = dropped.data();
      }
      gemm(true, false, L, D, L, 1.0, p_used, L, dout, C, 0.0, dv, 3 * C);
      // dS = P (dP - rowsum(P dP)): the softmax's Jacobian applied per row.
      for (std::int64_t i = 0; i < L; ++i) {
        const T* pi = p.data() + i * L;
        T* di = dp.data() + i * L;
        T dot = 0;
        for (std::int64_t j = 0; j <= i; ++j) dot += pi[j] * di[j];
        for (std::int64_t j = 0; j <= i; ++j) di[j] = pi[j] * (di[j] - dot);
        std::fill(di + i + 1, di + L, T(0));
      }
      gemm(false, false, L, D, L, scale, dp.data(), L, k, 3 * C, 0.0, dq, 3 * C);
      gemm(true, false, L, D, L, scale, dp.data(), L, q, 3 * C, 0.0, dk, 3 * C);
    }
  }
  return dqkv;
}

}  // namespace

AttentionForward causal_attention_forward(const Tensor& qkv, std::int64_t n_head, double dropout_p, Generator& gen) {
  const Dims d = check_qkv(qkv, n_head, "causal_attention_forward");
  TROUPE_CHECK(dropout_p >= 0 && dropout_p < 1, "causal_attention_forward: dropout must be in [0, 1), got ",
               dropout_p);
  if (qkv.dtype() == DType::f64) return forward_cpu<double>(qkv, d, dropout_p, gen);
  return forward_cpu<float>(qkv, d, dropout_p, gen);
}

Tensor causal_attention_backward(const Tensor& grad_out, const Tensor& qkv, const AttentionForward& forward,
                                 std::int64_t n_head) {
  const Dims d = check_qkv(qkv, n_head, "causal_attention_backward");
  TROUPE_CHECK(grad_out.defined() && grad_out.dtype() == qkv.dtype() &&
                   grad_out.shape() == Shape({d.batch, d.time, d.channels}),
               "causal_attention_backward: grad_out must be ", qkv.dtype(), " ",
               to_string(Shape({d.batch, d.time, d.channels})), ", got ",
               grad_out.defined() ? to_string(grad_out.shape()) : std::string("an undefined tensor"));
  TROUPE_CHECK(forward.log_sum_exp.defined() && forward.log_sum_exp.shape() == Shape({d.batch, d.heads, d.time}),
               "causal_attention_backward: the forward's saved statistics do not match qkv ",
               to_string(qkv.shape()));
  if (qkv.dtype() == DType::f64) return backward_cpu<double>(grad_out, qkv, forward, d);
  return backward_cpu<float>(grad_out, qkv, forward, d);
}

}  // namespace troupe::tensor
