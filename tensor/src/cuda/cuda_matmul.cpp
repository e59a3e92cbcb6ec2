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
    Handle() { TROUPE_CUBLAS_CHECK(cublasCreate(&h)); }
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

// A row-major operand as cuBLAS sees it: rows of `cols` elements, `ld` apart.
struct Operand {
  const void* data;
  std::int64_t rows, cols, ld;
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

// cuBLAS's fastest 16-bit kernels on sm_90 (TMA loads and stores) need every row to
// start 16 bytes apart. GPT-2's vocabulary of 50257 gives its logits rows that do not,
// and the lm_head's three gemms ran at ~120 TFLOP/s. A large 16-bit gemm with such an
// operand goes through copies padded to 16 bytes: the copies cost what reading and
// writing those operands once does, and the gemm gets the fast kernels.
constexpr std::int64_t kPaddedGemmWork = std::int64_t{1} << 28;  // m*n*k below which the copies cost more
constexpr std::int64_t kRowAlign = 8;                            // 16 bytes of 2-byte elements

std::int64_t padded(std::int64_t ld) { return (ld + kRowAlign - 1) / kRowAlign * kRowAlign; }

}  // namespace

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const void* a, const void* b, double beta, void* c) {
  cublasHandle_t h = thread_handle();
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const Operand oa{a, trans_a ? k : m, trans_a ? m : k, trans_a ? m : k};
  const Operand ob{b, trans_b ? n : k, trans_b ? k : n, trans_b ? k : n};
  const bool half = dtype == DType::f16 || dtype == DType::bf16;
  const bool unaligned = oa.ld % kRowAlign != 0 || ob.ld % kRowAlign != 0 || n % kRowAlign != 0;
  if (!half || !unaligned || m * n * k < kPaddedGemmWork) {
    gemm_ex(h, dtype, trans_a, trans_b, im, in, ik, alpha, a, static_cast<int>(oa.ld), b, static_cast<int>(ob.ld),
            beta, c, in);
    return;
  }
  int device = 0;
  TROUPE_CUDA_CHECK(cudaGetDevice(&device));
  constexpr std::size_t elem = 2;
  // An operand already aligned is used in place; the others are copied into rows
  // padded to 16 bytes (the padding is never read: the gemm's sizes stop short of it).
  const auto place = [&](const Operand& o, Scratch& keep) -> std::pair<const void*, std::int64_t> {
    if (o.ld % kRowAlign == 0) return {o.data, o.ld};
    const std::int64_t ld = padded(o.ld);
    keep = Scratch(static_cast<std::size_t>(o.rows * ld) * elem, device);
    copy_rows_2byte(o.data, o.ld, keep.get(), ld, o.rows, o.cols);
    return {keep.get(), ld};
  };
  Scratch sa, sb, sc;
  const auto [pa, lda] = place(oa, sa);
  const auto [pb, ldb] = place(ob, sb);
  void* pc = c;
  std::int64_t ldc = n;
  if (n % kRowAlign != 0) {
    ldc = padded(n);
    sc = Scratch(static_cast<std::size_t>(m * ldc) * elem, device);
    pc = sc.get();
    if (beta != 0) copy_rows_2byte(c, n, pc, ldc, m, n);
  }
  gemm_ex(h, dtype, trans_a, trans_b, im, in, ik, alpha, pa, static_cast<int>(lda), pb, static_cast<int>(ldb), beta,
          pc, static_cast<int>(ldc));
  if (pc != c) copy_rows_2byte(pc, ldc, c, n, m, n);
}

}  // namespace troupe::tensor::cuda_backend
