// Row-major gemm through cuBLAS, which is column-major: C = A B in row-major is
// C^T = B^T A^T in column-major, so the operands are passed swapped, not transposed.
// f16/bf16 use cublasGemmEx with f32 accumulation; f32 is cuBLAS's f32 gemm, or with
// TF32 allowed (cuda_math.hpp) its TF32 one. An f32 Linear's bias is added in
// cuBLASLt's epilogue, as torch's addmm does: a separate add reads and writes the
// whole output once more (~1.5 ms of a GPT-2-small step on an H200).
#include <cublasLt.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "cuda_backend.hpp"
#include "cuda_check.hpp"

namespace troupe::tensor::cuda_backend {

namespace {

// Off unless asked for, as torch.backends.cuda.matmul.allow_tf32.
std::atomic<bool> tf32_allowed{false};

// One cuBLAS handle per thread: handles are not safe to share across threads, and
// creating one costs milliseconds.
cublasHandle_t thread_handle() {
  struct Handle {
    cublasHandle_t h = nullptr;
    Handle() {
      TROUPE_CUBLAS_CHECK(cublasCreate(&h));
      // 16-bit products accumulate in f32 and round once, as on the host: no split-K
      // partial sums rounded to bf16/f16 (cuBLAS's default allows them).
      const auto mode =
          static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
      TROUPE_CUBLAS_CHECK(cublasSetMathMode(h, mode));
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
      if (allow_tf32()) {
        TROUPE_CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, n, m, k, &al, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &be, c,
                                         CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
        break;
      }
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

// ---- the bias epilogue (cuBLASLt) ----

cublasLtHandle_t thread_lt_handle() {
  struct Handle {
    cublasLtHandle_t h = nullptr;
    Handle() { TROUPE_CUBLAS_CHECK(cublasLtCreate(&h)); }
    ~Handle() { cublasLtDestroy(h); }
  };
  thread_local Handle handle;
  return handle.h;
}

// The largest power of two up to 256 that divides the address: cuBLASLt assumes 256
// unless told, and a kernel picked for that faults on a view at another offset.
std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

template <class T>
void set_attribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t what, const T& value) {
  TROUPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, what, &value, sizeof value));
}
template <class T>
void set_preference(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t what, const T& value) {
  TROUPE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, what, &value, sizeof value));
}

// The descriptors of one call, destroyed however it ends (the checks throw).
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// What the heuristic picked for one shape and set of alignments, or nothing: then the
// product runs as gemm + add. Asked once per key and thread, since the query costs
// tens of microseconds of host time for each of a model's Linears.
struct LtPlan {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  std::size_t workspace = 0;
};
using LtKey = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::uint32_t, std::uint32_t, std::uint32_t,
                         std::uint32_t, bool>;
constexpr std::size_t kLtWorkspace = std::size_t{32} << 20;  // cuBLAS's own default on Hopper

}  // namespace

void set_allow_tf32(bool allow) { tf32_allowed.store(allow, std::memory_order_relaxed); }

bool allow_tf32() { return tf32_allowed.load(std::memory_order_relaxed); }

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
          static_cast<int>(trans_a ? mp : kp), pb, static_cast<int>(trans_b ? kp : np), beta, pc, static_cast<int>(np));
  if (pc != c) copy_rows_2byte(pc, np, m, n, c, n, m, n);
}

bool linear_bias(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const void* x, const void* w,
                 const void* bias, void* y) {
  // As torch's addmm: degenerate and very large shapes stay unfused, where cuBLASLt has
  // had bugs, and so does a bias under 16 bytes aligned (no preference covers it).
  constexpr std::int64_t kMaxDim = 65535 * 32;
  if (dtype != DType::f32 || m < 2 || n < 2 || k < 2 || m >= kMaxDim || n >= kMaxDim || k >= kMaxDim ||
      alignment_of(bias) < 16)
    return false;
  int device = 0;
  TROUPE_CUDA_CHECK(cudaGetDevice(&device));
  cublasLtHandle_t lt = thread_lt_handle();
  // Column-major, as gemm above: y^T [n, m] = op(w) x^T, w stored [k, n] and transposed,
  // x stored [k, m]; the bias runs along y^T's rows.
  LtDescriptors desc;
  const bool tf32 = allow_tf32();
  TROUPE_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&desc.op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_attribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  set_attribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  TROUPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.a, CUDA_R_32F, k, n, k));
  TROUPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.b, CUDA_R_32F, k, m, k));
  TROUPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_32F, n, m, n));

  const LtKey key{device, m, n, k, alignment_of(w), alignment_of(x), alignment_of(y), alignment_of(bias), tf32};
  thread_local std::map<LtKey, LtPlan> plans;
  auto plan = plans.find(key);
  if (plan == plans.end()) {
    LtPlan made;
    TROUPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&desc.preference));
    set_preference(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{kLtWorkspace});
    set_preference(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::get<4>(key));
    set_preference(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::get<5>(key));
    set_preference(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, std::get<6>(key));
    set_preference(desc.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, std::get<6>(key));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                                 desc.preference, 1, &result, &returned);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
        result.workspaceSize <= kLtWorkspace)
      made = {true, result.algo, result.workspaceSize};
    plan = plans.emplace(key, made).first;
  }
  if (!plan->second.found) return false;
  Scratch workspace;
  if (plan->second.workspace > 0) workspace = Scratch(plan->second.workspace, device);
  const float alpha = 1, beta = 0;
  // Stream 0, the legacy default stream, as the cuBLAS handle and every kernel here.
  const cublasStatus_t status = cublasLtMatmul(lt, desc.op, &alpha, w, desc.a, x, desc.b, &beta, y, desc.d, y, desc.d,
                                               &plan->second.algo, workspace.get(), plan->second.workspace, nullptr);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    plan->second.found = false;
    return false;
  }
  cublas_check(status, tf32 ? "cublasLtMatmul (tf32, bias epilogue)" : "cublasLtMatmul (f32, bias epilogue)", __FILE__,
               __LINE__);
  return true;
}

}  // namespace troupe::tensor::cuda_backend
