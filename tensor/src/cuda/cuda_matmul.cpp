// Row-major gemm through cuBLAS, which is column-major: C = A B in row-major is
// C^T = B^T A^T in column-major, so the operands are passed swapped and nothing is
// copied. f16/bf16 use cublasGemmEx with f32 accumulation.
#include "cuda_backend.hpp"
#include "cuda_check.hpp"

namespace troupe::tensor::cuda_backend {

namespace {

// One cuBLAS handle per thread: handles are not safe to share across threads, and
// creating one costs milliseconds.
cublasHandle_t thread_handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    Handle() { TROUPE_CUBLAS_CHECK(cublasCreate(&h)); }
    ~Handle() { cublasDestroy(h); }
  };
  thread_local Handle handle;
  return handle.h;
}

}  // namespace

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const void* a, const void* b, double beta, void* c) {
  cublasHandle_t h = thread_handle();
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const int lda = trans_a ? im : ik, ldb = trans_b ? ik : in;
  switch (dtype) {
    case DType::f32: {
      const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
      TROUPE_CUBLAS_CHECK(cublasSgemm(h, op_b, op_a, in, im, ik, &al, static_cast<const float*>(b), ldb,
                                      static_cast<const float*>(a), lda, &be, static_cast<float*>(c), in));
      break;
    }
    case DType::f64:
      TROUPE_CUBLAS_CHECK(cublasDgemm(h, op_b, op_a, in, im, ik, &alpha, static_cast<const double*>(b), ldb,
                                      static_cast<const double*>(a), lda, &beta, static_cast<double*>(c), in));
      break;
    case DType::f16:
    case DType::bf16: {
      const cudaDataType_t t = dtype == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
      const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
      TROUPE_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, in, im, ik, &al, b, t, ldb, a, t, lda, &be, c, t, in,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      break;
    }
    default:
      TROUPE_THROW(InvalidArgument, "matmul on CUDA: dtype ", dtype_name(dtype),
                   " is not supported by cuBLAS; use f32, f64, f16 or bf16");
  }
}

}  // namespace troupe::tensor::cuda_backend
