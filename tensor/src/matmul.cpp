// Matrix multiply: 2-D, row-major, transposes as flags. f32 and f64 go straight to
// a library product (host_gemm.hpp's on the host for f32, cblas_dgemm for f64,
// cuBLAS on a GPU), so the wrapper adds only argument checks; f16/bf16 are widened to
// f32 for the multiply and rounded once on store, as PyTorch's CPU path does; integer
// dtypes use a plain loop. linear adds its bias inside the product where it can: the
// output starts as the bias rows on the host, cuBLASLt's epilogue adds it on a GPU.
#include <cblas.h>

#include <cstring>

#include "convert.hpp"
#include "cuda/cuda_backend.hpp"
#include "host_gemm.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::tensor {

namespace {

struct GemmShape {
  std::int64_t m, n, k;
};

GemmShape check_gemm(const Tensor& a, const Tensor& b, Transpose ta, Transpose tb, const char* op) {
  a.check_defined(op);
  b.check_defined(op);
  TROUPE_CHECK(a.dim() == 2 && b.dim() == 2, op, ": needs 2-D tensors, got ", to_string(a.shape()), " and ",
               to_string(b.shape()));
  TROUPE_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ, ", a.dtype(), " and ", b.dtype());
  TROUPE_CHECK(a.device() == b.device(), op, ": tensors on ", a.device(), " and ", b.device());
  const bool t_a = ta == Transpose::yes, t_b = tb == Transpose::yes;
  const GemmShape s{a.shape()[t_a ? 1 : 0], b.shape()[t_b ? 0 : 1], a.shape()[t_a ? 0 : 1]};
  const auto kb = b.shape()[t_b ? 1 : 0];
  TROUPE_CHECK(s.k == kb, op, ": inner dimensions differ, ", t_a ? "a^T" : "a", " is [", s.m, ", ", s.k, "], ",
               t_b ? "b^T" : "b", " is [", kb, ", ", s.n, "] (a ", to_string(a.shape()), ", b ", to_string(b.shape()),
               ")");
  return s;
}

bool overlaps(const Tensor& x, const Tensor& y) {
  if (!x.shares_storage_with(y)) return false;
  const auto* xb = static_cast<const char*>(x.raw_data());
  const auto* yb = static_cast<const char*>(y.raw_data());
  return xb < yb + y.nbytes() && yb < xb + x.nbytes();
}

template <class T>
void gemm_loop(bool ta, bool tb, const GemmShape& s, double alpha, const T* a, const T* b, double beta, T* c) {
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < s.n; ++j) {
      compute_t<T> acc{};
      for (std::int64_t p = 0; p < s.k; ++p) {
        const T x = ta ? a[p * s.m + i] : a[i * s.k + p];
        const T y = tb ? b[j * s.k + p] : b[p * s.n + j];
        acc += detail::load(x) * detail::load(y);
      }
      const double prior = beta == 0 ? 0.0 : beta * static_cast<double>(detail::load(c[i * s.n + j]));
      c[i * s.n + j] = detail::convert<T>(alpha * static_cast<double>(acc) + prior);
    }
}

void gemm_host(DType dtype, bool ta, bool tb, const GemmShape& s, double alpha, const void* a, const void* b,
               double beta, void* c) {
  const auto trans_a = ta ? CblasTrans : CblasNoTrans, trans_b = tb ? CblasTrans : CblasNoTrans;
  const auto m = static_cast<blasint>(s.m), n = static_cast<blasint>(s.n), k = static_cast<blasint>(s.k);
  const blasint lda = ta ? m : k, ldb = tb ? k : n;
  switch (dtype) {
    case DType::f32:
      detail::sgemm(ta, tb, s.m, s.n, s.k, static_cast<float>(alpha), static_cast<const float*>(a), lda,
                    static_cast<const float*>(b), ldb, static_cast<float>(beta), static_cast<float*>(c), s.n);
      return;
    case DType::f64:
      cblas_dgemm(CblasRowMajor, trans_a, trans_b, m, n, k, alpha, static_cast<const double*>(a), lda,
                  static_cast<const double*>(b), ldb, beta, static_cast<double*>(c), n);
      return;
    case DType::f16:
    case DType::bf16: {
      // Widen, multiply in f32, round once.
      Tensor a32 = Tensor::empty({s.m * s.k}), b32 = Tensor::empty({s.k * s.n}), c32 = Tensor::empty({s.m * s.n});
      detail::cast_host(a, dtype, a32.raw_data(), DType::f32, s.m * s.k);
      detail::cast_host(b, dtype, b32.raw_data(), DType::f32, s.k * s.n);
      if (beta != 0) detail::cast_host(c, dtype, c32.raw_data(), DType::f32, s.m * s.n);
      gemm_host(DType::f32, ta, tb, s, alpha, a32.raw_data(), b32.raw_data(), beta, c32.raw_data());
      detail::cast_host(c32.raw_data(), DType::f32, c, dtype, s.m * s.n);
      return;
    }
    default:
      dispatch(dtype, [&](auto tag) {
        using T = decltype(tag);
        gemm_loop(ta, tb, s, alpha, static_cast<const T*>(a), static_cast<const T*>(b), beta, static_cast<T*>(c));
      });
  }
}

// The product into out, whose shape, dtype, device and storage the caller has checked.
void gemm_into(Tensor& out, const Tensor& a, const Tensor& b, const GemmShape& s, Transpose ta, Transpose tb,
               double alpha, double beta) {
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {  // BLAS rejects a leading dimension of 0; the product is all zeros
    if (beta == 0)
      out.zero_();
    else
      scale_(out, beta);
    return;
  }
  if (out.device().is_cuda()) {
    cuda_backend::gemm(a.dtype(), ta == Transpose::yes, tb == Transpose::yes, s.m, s.n, s.k, alpha, a.raw_data(),
                       b.raw_data(), beta, out.raw_data());
    return;
  }
  gemm_host(a.dtype(), ta == Transpose::yes, tb == Transpose::yes, s, alpha, a.raw_data(), b.raw_data(), beta,
            out.raw_data());
}

}  // namespace

void matmul_out(Tensor& out, const Tensor& a, const Tensor& b, Transpose ta, Transpose tb, double alpha, double beta) {
  const GemmShape s = check_gemm(a, b, ta, tb, "matmul");
  out.check_defined("matmul");
  TROUPE_CHECK(out.shape() == Shape({s.m, s.n}) && out.dtype() == a.dtype() && out.device() == a.device(),
               "matmul: output is ", out.dtype(), " ", to_string(out.shape()), " on ", out.device(),
               ", the product is ", a.dtype(), " [", s.m, ", ", s.n, "] on ", a.device());
  TROUPE_CHECK(!overlaps(out, a) && !overlaps(out, b), "matmul: output overlaps an input");
  gemm_into(out, a, b, s, ta, tb, alpha, beta);
}

Tensor matmul(const Tensor& a, const Tensor& b, Transpose ta, Transpose tb) {
  const GemmShape s = check_gemm(a, b, ta, tb, "matmul");
  Tensor out = Tensor::empty({s.m, s.n}, a.dtype(), a.device());
  gemm_into(out, a, b, s, ta, tb, 1, 0);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const GemmShape s = check_gemm(x, weight, Transpose::no, Transpose::yes, "linear");
  Tensor y = Tensor::empty({s.m, s.n}, x.dtype(), x.device());
  const auto product = [&](double beta) { gemm_into(y, x, weight, s, Transpose::no, Transpose::yes, 1, beta); };
  if (!bias.defined()) {
    product(0);
    return y;
  }
  TROUPE_CHECK(bias.shape() == Shape({s.n}) && bias.dtype() == x.dtype() && bias.device() == x.device(),
               "linear: bias must be ", x.dtype(), " [", s.n, "] on ", x.device(), ", got ", bias.dtype(), " ",
               to_string(bias.shape()), " on ", bias.device());
  if (x.device().is_cuda() && s.m > 0 && s.n > 0 &&
      cuda_backend::linear_bias(x.dtype(), s.m, s.n, s.k, x.raw_data(), weight.raw_data(), bias.raw_data(),
                                y.raw_data()))
    return y;
  const bool prefill = x.device().is_cpu() && (x.dtype() == DType::f32 || x.dtype() == DType::f64) && s.k > 0;
  if (!prefill) {
    product(0);
    add_(y, bias);
    return y;
  }
  const std::size_t row_bytes = static_cast<std::size_t>(s.n) * element_size(x.dtype());
  auto* out = static_cast<char*>(y.raw_data());
  for (std::int64_t r = 0; r < s.m; ++r)
    std::memcpy(out + static_cast<std::size_t>(r) * row_bytes, bias.raw_data(), row_bytes);
  product(1);
  return y;
}

void set_num_threads(int n) {
  TROUPE_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got ", n);
  openblas_set_num_threads(n);
}

}  // namespace troupe::tensor
