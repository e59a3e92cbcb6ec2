// The host's f32 product (tensor/src/host_gemm.hpp): the AVX-512 kernel against a
// double-precision product and OpenBLAS, on every transpose, ragged edges, several
// k-blocks and strides; and its promise that a slice of rows or columns gives the bits
// of the whole.
#include "../../tensor/src/host_gemm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/tensor/ops.hpp"

using troupe::tensor::detail::host_gemm_available;
using troupe::tensor::detail::HostGemm;
using troupe::tensor::detail::sgemm;

namespace {

struct Case {
  std::int64_t m, n, k;
  bool ta, tb;
};

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Operands laid out as a caller would, each row `pad` floats longer than it needs.
struct Operands {
  Case s;
  std::int64_t pad, lda, ldb, ldc;
  std::vector<float> a, b, c;

  Operands(Case s_, std::int64_t pad_, unsigned seed) : s(s_), pad(pad_) {
    lda = (s.ta ? s.m : s.k) + pad;
    ldb = (s.tb ? s.k : s.n) + pad;
    ldc = s.n + pad;
    a = random_floats(static_cast<std::size_t>((s.ta ? s.k : s.m) * lda), seed);
    b = random_floats(static_cast<std::size_t>((s.tb ? s.n : s.k) * ldb), seed + 1);
    c = random_floats(static_cast<std::size_t>(s.m * ldc), seed + 2);
  }
  float op_a(std::int64_t i, std::int64_t p) const { return s.ta ? a[p * lda + i] : a[i * lda + p]; }
  float op_b(std::int64_t p, std::int64_t j) const { return s.tb ? b[j * ldb + p] : b[p * ldb + j]; }

  std::vector<float> run(HostGemm which, float alpha, float beta) const {
    std::vector<float> out = c;
    sgemm(s.ta, s.tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(), ldb, beta, out.data(), ldc, which);
    return out;
  }
};

// Rows r0 .. r0 + rows of op(a) x op(b) on their own (a row of op(a) starts at column
// r0 of a^T), into `out`, rows of x.ldc floats.
std::vector<float> multiply_rows(const Operands& x, std::int64_t r0, std::int64_t rows) {
  std::vector<float> out(static_cast<std::size_t>(rows * x.ldc), std::numeric_limits<float>::quiet_NaN());
  const float* a_rows = x.s.ta ? x.a.data() + r0 : x.a.data() + r0 * x.lda;
  sgemm(x.s.ta, x.s.tb, rows, x.s.n, x.s.k, 1.0f, a_rows, x.lda, x.b.data(), x.ldb, 0.0f, out.data(), x.ldc,
        HostGemm::avx512);
  return out;
}

const Case kCases[] = {
    {1, 1, 1, false, false},     {37, 131, 77, true, true},    {12, 32, 16, false, true},   {13, 33, 17, true, false},
    {100, 70, 300, false, true}, {300, 45, 600, false, false}, {145, 3100, 40, true, true}, {64, 256, 64, false, true},
    {256, 64, 256, true, false}, {5, 3, 513, false, true},     {200, 40, 30, true, false},  {1, 4000, 9, false, false},
};

}  // namespace

TEST(HostGemm, TheAvx512KernelMatchesADoubleProductAndBlas) {
  if (!host_gemm_available(HostGemm::avx512)) GTEST_SKIP() << "this CPU does not run AVX-512";
  unsigned seed = 1;
  for (const Case& s : kCases)
    for (const std::int64_t pad : {0, 3})
      for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 2.0f}}) {
        const Operands x(s, pad, seed++);
        const std::vector<float> got = x.run(HostGemm::avx512, alpha, beta);
        const std::vector<float> blas = x.run(HostGemm::blas, alpha, beta);
        for (std::int64_t i = 0; i < s.m; ++i)
          for (std::int64_t j = 0; j < x.ldc; ++j) {
            const std::size_t at = static_cast<std::size_t>(i * x.ldc + j);
            if (j >= s.n) {  // past the product: untouched
              ASSERT_EQ(got[at], x.c[at]) << "padding written at " << i << ", " << j;
              continue;
            }
            double exact = beta * static_cast<double>(x.c[at]), magnitude = std::fabs(exact);
            for (std::int64_t p = 0; p < s.k; ++p) {
              const double term = static_cast<double>(x.op_a(i, p)) * x.op_b(p, j);
              exact += alpha * term;
              magnitude += std::fabs(alpha * term);
            }
            // Each of k + 2 roundings errs by at most half an ulp of the running sum.
            const double bound = (static_cast<double>(s.k) + 2) * 0x1p-24 * magnitude + 1e-30;
            ASSERT_LE(std::fabs(got[at] - exact), bound)
                << "m " << s.m << " n " << s.n << " k " << s.k << (s.ta ? " a^T" : "") << (s.tb ? " b^T" : "")
                << " pad " << pad << " alpha " << alpha << " beta " << beta << " at " << i << ", " << j;
            ASSERT_LE(std::fabs(got[at] - blas[at]), 2 * bound) << "against OpenBLAS at " << i << ", " << j;
          }
      }
}

TEST(HostGemm, ASliceOfRowsOrColumnsGivesTheBitsOfTheWhole) {
  if (!host_gemm_available(HostGemm::avx512)) GTEST_SKIP() << "this CPU does not run AVX-512";
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      const Case whole{150, 100, 700, ta, tb};
      const Operands x(whole, 0, 7);
      const std::vector<float> all = x.run(HostGemm::avx512, 1.0f, 0.0f);
      // Rows 13..13+29 of op(a) on their own.
      const std::int64_t r0 = 13, rows = 29;
      const std::vector<float> part = multiply_rows(x, r0, rows);
      ASSERT_EQ(std::memcmp(part.data(), all.data() + r0 * x.ldc, part.size() * sizeof(float)), 0)
          << "rows " << r0 << ".." << r0 + rows << (ta ? " a^T" : "") << (tb ? " b^T" : "");
      // Columns 35..35+41 of op(b), written into the matching columns of c.
      const std::int64_t c0 = 35, cols = 41;
      std::vector<float> cpart(all.size(), std::numeric_limits<float>::quiet_NaN());
      const float* b_cols = tb ? x.b.data() + c0 * x.ldb : x.b.data() + c0;
      sgemm(ta, tb, whole.m, cols, whole.k, 1.0f, x.a.data(), x.lda, b_cols, x.ldb, 0.0f, cpart.data() + c0, x.ldc,
            HostGemm::avx512);
      for (std::int64_t i = 0; i < whole.m; ++i)
        ASSERT_EQ(std::memcmp(cpart.data() + i * x.ldc + c0, all.data() + i * x.ldc + c0, cols * sizeof(float)), 0)
            << "columns " << c0 << ".." << c0 + cols << " row " << i << (ta ? " a^T" : "") << (tb ? " b^T" : "");
    }
}

// Past 16 MiB of c in one k-block, full tiles on 64-byte boundaries are written with
// non-temporal stores (nothing of c is read back, and it would not stay in cache): the
// bits must be those of a slice of rows small enough to be stored as usual, into a
// buffer aligned as Storage's are, rows aligned (pad 0) or alternately not (pad 3).
TEST(HostGemm, AProductLargerThanTheCacheStreamsItsStoresWithTheSameBits) {
  if (!host_gemm_available(HostGemm::avx512)) GTEST_SKIP() << "this CPU does not run AVX-512";
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  for (const std::int64_t pad : {0, 3})
    for (const bool ta : {false, true}) {
      const Case whole{2053, 2064, 40, ta, true};
      const Operands x(whole, pad, 21);
      const std::size_t floats = static_cast<std::size_t>(whole.m * x.ldc);
      std::unique_ptr<float[], Free> all(static_cast<float*>(std::aligned_alloc(64, floats * sizeof(float))));
      ASSERT_NE(all, nullptr);
      std::memcpy(all.get(), x.c.data(), floats * sizeof(float));
      sgemm(ta, true, whole.m, whole.n, whole.k, 1.0f, x.a.data(), x.lda, x.b.data(), x.ldb, 0.0f, all.get(), x.ldc,
            HostGemm::avx512);
      const std::vector<float> blas = x.run(HostGemm::blas, 1.0f, 0.0f);
      const std::int64_t r0 = 1000, rows = 60;
      const std::vector<float> part = multiply_rows(x, r0, rows);
      for (std::int64_t i = 0; i < rows; ++i)
        ASSERT_EQ(std::memcmp(part.data() + i * x.ldc, all.get() + (r0 + i) * x.ldc, whole.n * sizeof(float)), 0)
            << "row " << r0 + i << " pad " << pad << (ta ? " a^T" : "");
      for (std::int64_t i = 0; i < whole.m; ++i)
        for (std::int64_t j = 0; j < x.ldc; ++j) {
          const std::size_t at = static_cast<std::size_t>(i * x.ldc + j);
          if (j >= whole.n)
            ASSERT_EQ(all[at], x.c[at]) << "padding written at " << i << ", " << j;
          else
            ASSERT_NEAR(all[at], blas[at], 1e-4f * (1.0f + std::fabs(blas[at]))) << "at " << i << ", " << j;
        }
    }
}

// Up to 64 rows of a times a transposed b (a Linear's forward over a small batch) run
// in another order (host_gemm.cpp): the same bits as rows of a larger product, for any
// alpha and beta, and with beta 0, c is not read.
TEST(HostGemm, FewRowsTimesATransposedBGiveTheBitsOfManyRows) {
  if (!host_gemm_available(HostGemm::avx512)) GTEST_SKIP() << "this CPU does not run AVX-512";
  const Case whole{150, 70, 600, false, true};
  const Operands x(whole, 3, 31);
  for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, {-0.7f, 0.3f}}) {
    const std::vector<float> all = x.run(HostGemm::avx512, alpha, beta);
    for (const auto& [r0, rows] : {std::pair<std::int64_t, std::int64_t>{0, 1}, {17, 29}, {80, 64}}) {
      std::vector<float> part(x.c.begin() + r0 * x.ldc, x.c.begin() + (r0 + rows) * x.ldc);
      if (beta == 0) std::fill(part.begin(), part.end(), std::numeric_limits<float>::quiet_NaN());
      sgemm(false, true, rows, whole.n, whole.k, alpha, x.a.data() + r0 * x.lda, x.lda, x.b.data(), x.ldb, beta,
            part.data(), x.ldc, HostGemm::avx512);
      for (std::int64_t i = 0; i < rows; ++i)
        ASSERT_EQ(std::memcmp(part.data() + i * x.ldc, all.data() + (r0 + i) * x.ldc, whole.n * sizeof(float)), 0)
            << "row " << r0 + i << " of a slice of " << rows << ", alpha " << alpha << " beta " << beta;
    }
  }
}

TEST(HostGemm, BetaZeroIgnoresWhatCHeldAndAnEmptyProductScales) {
  for (const HostGemm which : {HostGemm::blas, HostGemm::avx512}) {
    if (!host_gemm_available(which)) continue;
    const std::vector<float> a = random_floats(6 * 5, 3), b = random_floats(5 * 40, 4);
    std::vector<float> c(6 * 40, std::numeric_limits<float>::quiet_NaN());
    sgemm(false, false, 6, 40, 5, 1.0f, a.data(), 5, b.data(), 40, 0.0f, c.data(), 40, which);
    for (const float v : c) ASSERT_FALSE(std::isnan(v)) << "beta 0 read c";
    std::vector<float> d(6 * 40, 3.0f);
    sgemm(false, false, 6, 40, 0, 1.0f, a.data(), 1, b.data(), 40, 0.5f, d.data(), 40, which);
    for (const float v : d) ASSERT_EQ(v, 1.5f) << "k 0: c = beta c";
  }
}

TEST(HostGemm, ThreadsGiveTheBitsOfOneThread) {
  if (!host_gemm_available(HostGemm::avx512)) GTEST_SKIP() << "this CPU does not run AVX-512";
  for (const Case s : {Case{300, 200, 400, false, true}, Case{40, 900, 500, true, false}}) {
    const Operands x(s, 1, 11);
    troupe::tensor::set_num_threads(1);
    const std::vector<float> one = x.run(HostGemm::avx512, 1.0f, 1.0f);
    troupe::tensor::set_num_threads(3);
    const std::vector<float> three = x.run(HostGemm::avx512, 1.0f, 1.0f);
    troupe::tensor::set_num_threads(1);
    ASSERT_EQ(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)), 0)
        << "m " << s.m << " n " << s.n << " k " << s.k;
  }
}

// Run as it is and again by CTest under TROUPE_HOST_GEMM=blas and =bogus
// (tests/CMakeLists.txt): `best` is the kernel the variable names.
TEST(HostGemm, BestIsTheKernelTheEnvironmentNames) {
  const char* value = std::getenv("TROUPE_HOST_GEMM");
  const std::string named = value == nullptr ? "" : value;
  const Operands x(Case{50, 70, 700, false, true}, 0, 5);
  if (named == "bogus") {
    try {
      x.run(HostGemm::best, 1.0f, 0.0f);
      FAIL() << "TROUPE_HOST_GEMM=bogus was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("TROUPE_HOST_GEMM=bogus: expected auto, blas or avx512"), std::string::npos)
          << e.what();
    }
    return;
  }
  const bool avx512 = host_gemm_available(HostGemm::avx512);
  const HostGemm expected = named == "blas" || !avx512 ? HostGemm::blas : HostGemm::avx512;
  const std::vector<float> best = x.run(HostGemm::best, 1.0f, 0.0f);
  EXPECT_EQ(std::memcmp(best.data(), x.run(expected, 1.0f, 0.0f).data(), best.size() * sizeof(float)), 0);
  if (avx512) {  // the two kernels sum in other orders, so some bits differ
    const HostGemm other = expected == HostGemm::blas ? HostGemm::avx512 : HostGemm::blas;
    EXPECT_NE(std::memcmp(best.data(), x.run(other, 1.0f, 0.0f).data(), best.size() * sizeof(float)), 0);
  }
}
