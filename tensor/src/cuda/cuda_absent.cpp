// The CUDA entry points of a build without the toolkit. Tensor code checks the
// device before it gets here (check_device_usable), so these throw only if that
// check was skipped; the message says how to get a CUDA build.
#include "cuda_backend.hpp"

namespace troupe::tensor::cuda_backend {
namespace {
[[noreturn]] void absent(const char* op) {
  TROUPE_THROW(InvalidArgument, op, ": troupe was built without CUDA (configure with "
               "-DTROUPE_CUDA=ON where the CUDA toolkit is installed)");
}
}  // namespace

int device_count() { return 0; }
void synchronize() {}
void set_device(int) { absent("cuda set_device"); }
void* allocate(std::size_t, int) { absent("cuda allocate"); }
void release(void*, int) {}
CachingAllocator::Stats memory_stats(int) { return {}; }
void empty_cache() {}
void* allocate_pinned(std::size_t) { return nullptr; }
void release_pinned(void*) {}
bool is_pinned(const void*) { return false; }
void copy(void*, const void*, std::size_t, CopyKind) { absent("cuda copy"); }
void fill(void*, DType, std::int64_t, double) { absent("cuda fill"); }
void cast(const void*, DType, void*, DType, std::int64_t) { absent("cuda cast"); }
void binary(BinaryOp, DType, const void*, const void*, bool, void*, std::int64_t) { absent("cuda binary op"); }
void binary_broadcast(BinaryOp, DType, const void*, const void*, const BroadcastIndex&, void*, std::int64_t) {
  absent("cuda broadcast binary op");
}
void unary(UnaryOp, DType, const void*, void*, std::int64_t, double, double) { absent("cuda unary op"); }
void reduce(ReduceOp, DType, const void*, DType, void*, std::int64_t, std::int64_t, std::int64_t) {
  absent("cuda reduction");
}
void axpy(DType, void*, double, const void*, std::int64_t) { absent("cuda axpy"); }
void scale(DType, void*, double, std::int64_t) { absent("cuda scale"); }
void random_uniform(DType, void*, std::int64_t, std::uint64_t, std::uint64_t, double, double) { absent("cuda uniform"); }
void random_normal(DType, void*, std::int64_t, std::uint64_t, std::uint64_t, double, double) { absent("cuda normal"); }
void activation_grad(detail::ActivationGrad, DType, const void*, const void*, void*, std::int64_t) {
  absent("cuda activation gradient");
}
void cross_entropy_rows(DType, const void*, const std::int64_t*, std::int64_t, std::int64_t, std::int64_t, double,
                        double*, double*) {
  absent("cuda cross entropy");
}
void cross_entropy_grad(DType, const void*, const std::int64_t*, const double*, std::int64_t, std::int64_t,
                        std::int64_t, double, double, void*) {
  absent("cuda cross entropy gradient");
}
void layer_norm_forward(DType, const void*, const void*, const void*, std::int64_t, std::int64_t, double, void*,
                        double*, double*) {
  absent("cuda layer_norm");
}
void layer_norm_backward(DType, const void*, const void*, const void*, const double*, const double*, std::int64_t,
                         std::int64_t, void*, void*, void*) {
  absent("cuda layer_norm backward");
}
void gather_rows(DType, const void*, const std::int64_t*, std::int64_t, std::int64_t, void*) {
  absent("cuda gather_rows");
}
void scatter_add_rows(DType, void*, const std::int64_t*, const std::int64_t*, const std::int64_t*, std::int64_t,
                      std::int64_t, const void*) {
  absent("cuda scatter_add_rows");
}
void attention_forward(DType, const void*, const AttentionShape&, const AttentionDropout&, void*, void*) {
  absent("cuda causal attention");
}
void attention_backward(DType, const void*, const void*, const void*, const void*, const AttentionShape&,
                        const AttentionDropout&, void*, void*) {
  absent("cuda causal attention backward");
}
void adam_steps(const AdamList&) { absent("cuda fused Adam"); }
void sgd_steps(const SgdList&) { absent("cuda fused SGD"); }
void sum_squares_chunks(const SquaresList&, double*) { absent("cuda sum of squares"); }
void sum_in_order(const double*, std::int64_t, double*) { absent("cuda sum"); }
void scale_chunks(const ScaleList&, float) { absent("cuda scale of a list"); }
void copy_rows_2byte(const void*, std::int64_t, std::int64_t, std::int64_t, void*, std::int64_t, std::int64_t,
                     std::int64_t) {
  absent("cuda copy_rows_2byte");
}
void gemm(DType, bool, bool, std::int64_t, std::int64_t, std::int64_t, double, const void*, const void*,
          double, void*) { absent("cuda gemm"); }
bool linear_bias(DType, std::int64_t, std::int64_t, std::int64_t, const void*, const void*, const void*, void*) {
  absent("cuda linear");
}
void sgd_step(float*, const float*, float*, std::int64_t, const SgdScalars&) { absent("cuda fused SGD"); }
void adam_step(float*, const float*, float*, float*, std::int64_t, const AdamScalars&) { absent("cuda fused Adam"); }
void unscale_and_check(float*, std::int64_t, float, float*) { absent("cuda unscale"); }

}  // namespace troupe::tensor::cuda_backend
