// Row-major gemm through cuBLAS, which is column-major: C = A B in row-major is
// C^T = B^T A^T in column-major, so the operands are passed swapped, not transposed.
// f16/bf16 use cublasGemmEx with f32 accumulation.
#include <utility>

#include "cuda_backend.hpp"
#include "cuda_check.hpp"

namespace troupe::tensor::cuda_backend {

namespace {

// One cuBLAS handle per thread: handles are not safe to share across threads, and
// creating one costs milliseconds.
cublasHandle_t thread_handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    Handle() {
      TROUPE_CUBLAS_CHECK(cublasCreate(&h));
      // 16-bit products accumulate in f32 and round once, as on the host: no split-K
      // partial sums rounded to bf16/f16 (cuBLAS's default allows them).
      TROUPE_CUBLAS_CHECK(cublasSetMathMode(h, static_cast<cublasMath_t>(
                                                   CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    }
    ~Handle() { cublasDestroy(h); }
  };
  thread_local Handle handle;
  return handle.h;
}

// A device buffer for one gemm, back to the caching allocator when the gemm is queued:
// everything runs on the default stream, so a later user of the block waits for it.
class Scratch {
 public:
  Scratch() = default;
  Scratch(std::size_t nbytes, int device) : data_(allocate(nbytes, device)), device_(device) {}
  Scratch(Scratch&& o) noexcept : data_(std::exchange(o.data_, nullptr)), device_(o.device_) {}
  Scratch& operator=(Scratch&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(device_, o.device_);
    return *this;
  }
  ~Scratch() {
    if (data_ != nullptr) release(data_, device_);
  }
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
  int device_ = 0;
};

// A row-major operand: rows x cols at data, contiguous.
struct Operand {
  const void* data;
  std::int64_t rows, cols;
};

void gemm_ex(cublasHandle_t h, DType dtype, bool trans_a, bool trans_b, int m, int n, int k, double alpha,
             const void* a, int lda, const void* b, int ldb, double beta, void* c, int ldc) {
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  switch (dtype) {
    case DType::f32: {
      const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
      TROUPE_CUBLAS_CHECK(cublasSgemm(h, op_b, op_a, n, m, k, &al, static_cast<const float*>(b), ldb,
                                      static_cast<const float*>(a), lda, &be, static_cast<float*>(c), ldc));
      break;
    }
    case DType::f64:
      TROUPE_CUBLAS_CHECK(cublasDgemm(h, op_b, op_a, n, m, k, &alpha, static_cast<const double*>(b), ldb,
                                      static_cast<const double*>(a), lda, &beta, static_cast<double*>(c), ldc));
      break;
    case DType::f16:
    case DType::bf16: {
      const cudaDataType_t t = dtype == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
      const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
      TROUPE_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, n, m, k, &al, b, t, ldb, a, t, lda, &be, c, t, ldc,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      break;
    }
    default:
      TROUPE_THROW(InvalidArgument, "matmul on CUDA: dtype ", dtype_name(dtype),
                   " is not supported by cuBLAS; use f32, f64, f16 or bf16");
  }
}

// A 16-bit product with a dimension that is not a multiple of 8 runs on cuBLAS's slow
// kernels: GPT-2's vocabulary of 50257 made the lm_head's three gemms run at ~95
// TFLOP/s on an H200, in troupe and in PyTorch alike, where the block's gemms run at
// ~450 (and padding only the output's rows to 16 bytes did not help). A large such
// product runs on copies of its operands with those dimensions padded to a multiple of
// 64, zeros in the padding (so the padded inner dimension adds nothing): the copies cost
// what reading and writing the operands once does. nanoGPT pads its vocabulary to 50304
// for the same reason; here the model keeps its shape.
constexpr std::int64_t kPaddedGemmWork = std::int64_t{1} << 28;  // m*n*k below which the copies cost more

std::int64_t padded(std::int64_t d) { return d % 8 == 0 ? d : (d + 63) / 64 * 64; }

}  // namespace

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const void* a, const void* b, double beta, void* c) {
  cublasHandle_t h = thread_handle();
  const bool half = dtype == DType::f16 || dtype == DType::bf16;
  const std::int64_t mp = padded(m), np = padded(n), kp = padded(k);
  if (!half || (mp == m && np == n && kp == k) || m * n * k < kPaddedGemmWork) {
    gemm_ex(h, dtype, trans_a, trans_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
            static_cast<int>(trans_a ? m : k), b, static_cast<int>(trans_b ? k : n), beta, c, static_cast<int>(n));
    return;
  }
  int device = 0;
  TROUPE_CUDA_CHECK(cudaGetDevice(&device));
  constexpr std::size_t elem = 2;
  // An operand whose dimensions need no padding is used in place.
  const auto place = [&](const Operand& o, std::int64_t rows, std::int64_t cols, Scratch& keep) {
    if (rows == o.rows && cols == o.cols) return o.data;
    keep = Scratch(static_cast<std::size_t>(rows * cols) * elem, device);
    copy_rows_2byte(o.data, o.cols, o.rows, o.cols, keep.get(), cols, rows, cols);
    return static_cast<const void*>(keep.get());
  };
  Scratch sa, sb, sc;
  const void* pa = trans_a ? place({a, k, m}, kp, mp, sa) : place({a, m, k}, mp, kp, sa);
  const void* pb = trans_b ? place({b, n, k}, np, kp, sb) : place({b, k, n}, kp, np, sb);
  void* pc = c;
  if (mp != m || np != n) {
    sc = Scratch(static_cast<std::size_t>(mp * np) * elem, device);
    pc = sc.get();
    if (beta != 0) copy_rows_2byte(c, n, m, n, pc, np, mp, np);
  }
  gemm_ex(h, dtype, trans_a, trans_b, static_cast<int>(mp), static_cast<int>(np), static_cast<int>(kp), alpha, pa,
          static_cast<int>(trans_a ? mp : kp), pb, static_cast<int>(trans_b ? kp : np), beta, pc,
          static_cast<int>(np));
  if (pc != c) copy_rows_2byte(pc, np, m, n, c, n, m, n);
}

}  // namespace troupe::tensor::cuda_backend
