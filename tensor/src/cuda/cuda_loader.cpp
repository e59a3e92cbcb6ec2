// cuda_backend's functions in libtroupe_tensor: each forwards to the table of
// libtroupe_tensor_cuda.so, opened with dlopen on the first call (cuda_table.hpp says
// why). Where the plugin is absent -- a build without CUDA, or its library missing or
// unloadable -- the queries answer "no device" and everything else throws, saying why.
// A static build links the backend itself in: its functions are the real ones, and
// this file only says that nothing is missing.
#include <dlfcn.h>

#include <string>

#include "cuda_table.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/device.hpp"

namespace troupe::tensor::cuda_backend {

#if defined(TROUPE_CUDA_LINKED)
std::string why_unavailable() { return {}; }
#else
namespace {

struct Loaded {
  const Table* table = nullptr;
  std::string why;  // when table is null
};

Loaded load() {
  if (!cuda_built())
    return {nullptr,
            "troupe was built without CUDA (configure with -DTROUPE_CUDA=ON where the CUDA toolkit is installed)"};
  // The plugin is installed beside this library, in the build tree and under a prefix.
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&load), &self) == 0 || self.dli_fname == nullptr)
    return {nullptr, "cannot find where libtroupe_tensor was loaded from"};
  std::string path = self.dli_fname;
  path = path.substr(0, path.find_last_of('/') + 1) + "libtroupe_tensor_cuda.so";
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return {nullptr, "cannot load the CUDA backend: " + std::string(dlerror())};
  auto* entry = reinterpret_cast<const Table* (*)()>(dlsym(library, "troupe_tensor_cuda_table"));
  if (entry == nullptr) return {nullptr, path + " has no troupe_tensor_cuda_table: not troupe's CUDA backend"};
  const Table* table = entry();
  if (table->version != kTableVersion)
    return {nullptr, path + " is version " + std::to_string(table->version) +
                         " of the CUDA backend, this library needs " + std::to_string(kTableVersion) +
                         " (a stale build or install?)"};
  return {table, {}};
}

const Loaded& loaded() {
  static const Loaded once = load();
  return once;
}

const Table& backend(const char* op) {
  const Loaded& l = loaded();
  if (l.table == nullptr) TROUPE_THROW(InvalidArgument, op, ": ", l.why);
  return *l.table;
}

}  // namespace

std::string why_unavailable() { return loaded().why; }

int device_count() {
  const Table* t = loaded().table;
  return t ? t->device_count() : 0;
}

void synchronize() {
  const Table* t = loaded().table;
  if (t) t->synchronize();
}

void set_device(int device) { backend("cuda set device").set_device(device); }

void* event_record() { return backend("cuda event").event_record(); }

double event_elapsed_ms(void* from, void* to) { return backend("cuda event").event_elapsed_ms(from, to); }

void event_destroy(void* event) {
  const Table* t = loaded().table;
  if (t) t->event_destroy(event);
}

void* allocate(std::size_t nbytes, int device) { return backend("cuda allocate").allocate(nbytes, device); }

void release(void* data, int device) {
  const Table* t = loaded().table;
  if (t) t->release(data, device);
}

void copy(void* dst, const void* src, std::size_t nbytes, CopyKind kind) {
  backend("cuda copy").copy(dst, src, nbytes, kind);
}

void fill(void* data, DType dtype, std::int64_t n, double value) { backend("cuda fill").fill(data, dtype, n, value); }

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n) {
  backend("cuda cast").cast(src, src_dtype, dst, dst_dtype, n);
}

void binary(BinaryOp op, DType dtype, const void* a, const void* b, bool b_is_scalar, void* out, std::int64_t n) {
  backend("cuda binary").binary(op, dtype, a, b, b_is_scalar, out, n);
}

void binary_broadcast(BinaryOp op, DType dtype, const void* a, const void* b, const BroadcastIndex& index, void* out,
                      std::int64_t n) {
  backend("cuda binary broadcast").binary_broadcast(op, dtype, a, b, index, out, n);
}

void unary(UnaryOp op, DType dtype, const void* in, void* out, std::int64_t n, double lo, double hi) {
  backend("cuda unary").unary(op, dtype, in, out, n, lo, hi);
}

void reduce(ReduceOp op, DType in_dtype, const void* in, DType out_dtype, void* out, std::int64_t outer, std::int64_t n,
            std::int64_t inner) {
  backend("cuda reduce").reduce(op, in_dtype, in, out_dtype, out, outer, n, inner);
}

void axpy(DType dtype, void* y, double alpha, const void* x, std::int64_t n) {
  backend("cuda axpy").axpy(dtype, y, alpha, x, n);
}

void scale(DType dtype, void* data, double alpha, std::int64_t n) {
  backend("cuda scale").scale(dtype, data, alpha, n);
}

void random_uniform(DType dtype, void* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double lo,
                    double hi) {
  backend("cuda random uniform").random_uniform(dtype, out, n, seed, offset, lo, hi);
}

void random_normal(DType dtype, void* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double mean,
                   double std) {
  backend("cuda random normal").random_normal(dtype, out, n, seed, offset, mean, std);
}

void copy_rows_2byte(const void* src, std::int64_t src_ld, std::int64_t rows, std::int64_t cols, void* dst,
                     std::int64_t dst_ld, std::int64_t dst_rows, std::int64_t dst_cols) {
  backend("cuda copy rows 2byte").copy_rows_2byte(src, src_ld, rows, cols, dst, dst_ld, dst_rows, dst_cols);
}

// A switch, not an operation: without the backend there is nothing it could change.
void set_allow_tf32(bool allow) {
  const Table* t = loaded().table;
  if (t) t->set_allow_tf32(allow);
}

bool allow_tf32() {
  const Table* t = loaded().table;
  return t ? t->allow_tf32() : false;
}

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const void* a, const void* b, double beta, void* c) {
  backend("cuda gemm").gemm(dtype, trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

bool linear_bias(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k, const void* x, const void* w,
                 const void* bias, void* y) {
  return backend("cuda linear bias").linear_bias(dtype, m, n, k, x, w, bias, y);
}

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, const SgdScalars& s) {
  backend("cuda sgd step").sgd_step(param, grad, momentum_buffer, n, s);
}

void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
               const AdamScalars& s) {
  backend("cuda adam step").adam_step(param, grad, exp_avg, exp_avg_sq, n, s);
}

void adam_steps(const AdamList& list) { backend("cuda adam steps").adam_steps(list); }

void sgd_steps(const SgdList& list) { backend("cuda sgd steps").sgd_steps(list); }

void sum_squares_chunks(const SquaresList& list, double* partials) {
  backend("cuda sum squares chunks").sum_squares_chunks(list, partials);
}

void sum_in_order(const double* values, std::int64_t n, double* out) {
  backend("cuda sum in order").sum_in_order(values, n, out);
}

void scale_chunks(const ScaleList& list, float factor) { backend("cuda scale chunks").scale_chunks(list, factor); }

void unscale_and_check(float* grad, std::int64_t n, float inv_scale, float* found_inf) {
  backend("cuda unscale and check").unscale_and_check(grad, n, inv_scale, found_inf);
}

void activation_grad(detail::ActivationGrad op, DType dtype, const void* saved, const void* grad, void* out,
                     std::int64_t n) {
  backend("cuda activation grad").activation_grad(op, dtype, saved, grad, out, n);
}

void cross_entropy_rows(DType dtype, const void* logits, const std::int64_t* target, std::int64_t rows,
                        std::int64_t classes, std::int64_t ignore_index, double eps, double* log_sum_exp,
                        double* row_loss) {
  backend("cuda cross entropy rows")
      .cross_entropy_rows(dtype, logits, target, rows, classes, ignore_index, eps, log_sum_exp, row_loss);
}

void cross_entropy_grad(DType dtype, const void* logits, const std::int64_t* target, const double* log_sum_exp,
                        std::int64_t rows, std::int64_t classes, std::int64_t ignore_index, double eps, double factor,
                        void* grad) {
  backend("cuda cross entropy grad")
      .cross_entropy_grad(dtype, logits, target, log_sum_exp, rows, classes, ignore_index, eps, factor, grad);
}

void layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias, std::int64_t rows,
                        std::int64_t n, double eps, void* y, double* mean, double* rstd) {
  backend("cuda layer norm forward").layer_norm_forward(dtype, x, weight, bias, rows, n, eps, y, mean, rstd);
}

void layer_norm_backward(DType dtype, const void* x, const void* gy, const void* weight, const double* mean,
                         const double* rstd, std::int64_t rows, std::int64_t n, void* gx, void* grad_weight,
                         void* grad_bias) {
  backend("cuda layer norm backward")
      .layer_norm_backward(dtype, x, gy, weight, mean, rstd, rows, n, gx, grad_weight, grad_bias);
}

void gather_rows(DType dtype, const void* table, const std::int64_t* idx, std::int64_t n, std::int64_t dim, void* out) {
  backend("cuda gather rows").gather_rows(dtype, table, idx, n, dim, out);
}

void scatter_add_rows(DType dtype, void* dst, const std::int64_t* rows, const std::int64_t* offsets,
                      const std::int64_t* positions, std::int64_t distinct, std::int64_t dim, const void* src) {
  backend("cuda scatter add rows").scatter_add_rows(dtype, dst, rows, offsets, positions, distinct, dim, src);
}

void attention_forward(DType dtype, const void* qkv, const AttentionShape& shape, const AttentionDropout& dropout,
                       void* out, void* lse) {
  backend("cuda attention forward").attention_forward(dtype, qkv, shape, dropout, out, lse);
}

void attention_backward(DType dtype, const void* qkv, const void* out, const void* grad_out, const void* lse,
                        const AttentionShape& shape, const AttentionDropout& dropout, void* delta, void* grad_qkv) {
  backend("cuda attention backward")
      .attention_backward(dtype, qkv, out, grad_out, lse, shape, dropout, delta, grad_qkv);
}

CachingAllocator::Stats memory_stats(int device) {
  const Table* t = loaded().table;
  return t ? t->memory_stats(device) : CachingAllocator::Stats{};
}

void empty_cache() {
  const Table* t = loaded().table;
  if (t) t->empty_cache();
}

void* allocate_pinned(std::size_t nbytes) {
  const Table* t = loaded().table;
  return t ? t->allocate_pinned(nbytes) : nullptr;
}

void release_pinned(void* data) {
  const Table* t = loaded().table;
  if (t) t->release_pinned(data);
}

bool is_pinned(const void* data) {
  const Table* t = loaded().table;
  return t ? t->is_pinned(data) : false;
}

#endif  // TROUPE_CUDA_LINKED

}  // namespace troupe::tensor::cuda_backend
