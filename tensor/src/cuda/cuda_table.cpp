// The entry point of libtroupe_tensor_cuda.so: its table of cuda_backend functions.
// The plugin is linked with -Bsymbolic-functions, so these addresses are its own
// definitions, not cuda_loader.cpp's forwarders of the same names.
#include "cuda_table.hpp"

namespace troupe::tensor::cuda_backend {
namespace {
const Table table{kTableVersion,
                  &device_count,
                  &synchronize,
                  &set_device,
                  &allocate,
                  &release,
                  &copy,
                  &fill,
                  &cast,
                  &binary,
                  &binary_broadcast,
                  &unary,
                  &reduce,
                  &axpy,
                  &scale,
                  &random_uniform,
                  &random_normal,
                  &copy_rows_2byte,
                  &set_allow_tf32,
                  &allow_tf32,
                  &gemm,
                  &linear_bias,
                  &sgd_step,
                  &adam_step,
                  &adam_steps,
                  &sgd_steps,
                  &sum_squares_chunks,
                  &sum_in_order,
                  &scale_chunks,
                  &unscale_and_check,
                  &activation_grad,
                  &cross_entropy_rows,
                  &cross_entropy_grad,
                  &layer_norm_forward,
                  &layer_norm_backward,
                  &gather_rows,
                  &scatter_add_rows,
                  &attention_forward,
                  &attention_backward,
                  &memory_stats,
                  &empty_cache,
                  &allocate_pinned,
                  &release_pinned,
                  &is_pinned,
                  &event_record,
                  &event_elapsed_ms,
                  &event_destroy};
}  // namespace
}  // namespace troupe::tensor::cuda_backend

extern "C" __attribute__((visibility("default"))) const troupe::tensor::cuda_backend::Table*
troupe_tensor_cuda_table() {
  return &troupe::tensor::cuda_backend::table;
}
