// The host's f32 matrix product, for matmul and attention alike: troupe's own
// AVX-512 kernel where the CPU runs it, else OpenBLAS's cblas_sgemm.
// docs/TENSOR.md ("Host matrix products") says why.
#pragma once

#include <cstdint>

namespace troupe::tensor::detail {

// `best` is the AVX-512 kernel on a CPU that runs it, else BLAS, unless the
// TROUPE_HOST_GEMM environment variable (auto, blas or avx512) pins one; the others
// are there so tests can compare the two. Either runs on set_num_threads' count of threads
// (the kernel only for products big enough to gain from them).
enum class HostGemm { best, blas, avx512 };

bool host_gemm_available(HostGemm which);

// c[m, n] (row stride ldc) = alpha op(a) op(b) + beta c, every matrix row-major, op a
// transpose where ta / tb. As BLAS: with beta 0, c is not read.
//
// The AVX-512 kernel's bits for one element of c depend only on its row of op(a),
// its column of op(b), k, alpha and beta -- not on m, n, the strides, where the
// element lies or the number of threads -- so a slice of rows multiplies to the same
// bits as the whole.
void sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc,
           HostGemm which = HostGemm::best);

}  // namespace troupe::tensor::detail
