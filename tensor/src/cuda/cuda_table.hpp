// The CUDA backend as one table of function pointers, one per function of
// cuda_backend.hpp. libtroupe_tensor_cuda.so (the .cu files, cudart, cuBLAS,
// cuBLASLt) hands it out; cuda_loader.cpp opens that library the first time a program
// asks for a GPU, so a CPU-only program or troupe-ckpt never maps the CUDA libraries
// (docs/ARCHITECTURE.md, "CUDA on demand").
#pragma once

#include <string>

#include "cuda_backend.hpp"

namespace troupe::tensor::cuda_backend {

// Bumped whenever a signature in cuda_backend.hpp changes, so that a stale plugin
// beside a newer libtroupe_tensor is refused rather than called with the wrong
// arguments.
inline constexpr int kTableVersion = 3;

struct Table {
  int version;
  decltype(&cuda_backend::device_count) device_count;
  decltype(&cuda_backend::synchronize) synchronize;
  decltype(&cuda_backend::set_device) set_device;
  decltype(&cuda_backend::allocate) allocate;
  decltype(&cuda_backend::release) release;
  decltype(&cuda_backend::copy) copy;
  decltype(&cuda_backend::fill) fill;
  decltype(&cuda_backend::cast) cast;
  decltype(&cuda_backend::binary) binary;
  decltype(&cuda_backend::binary_broadcast) binary_broadcast;
  decltype(&cuda_backend::unary) unary;
  decltype(&cuda_backend::reduce) reduce;
  decltype(&cuda_backend::axpy) axpy;
  decltype(&cuda_backend::scale) scale;
  decltype(&cuda_backend::random_uniform) random_uniform;
  decltype(&cuda_backend::random_normal) random_normal;
  decltype(&cuda_backend::copy_rows_2byte) copy_rows_2byte;
  decltype(&cuda_backend::set_allow_tf32) set_allow_tf32;
  decltype(&cuda_backend::allow_tf32) allow_tf32;
  decltype(&cuda_backend::gemm) gemm;
  decltype(&cuda_backend::linear_bias) linear_bias;
  decltype(&cuda_backend::sgd_step) sgd_step;
  decltype(&cuda_backend::adam_step) adam_step;
  decltype(&cuda_backend::adam_steps) adam_steps;
  decltype(&cuda_backend::sgd_steps) sgd_steps;
  decltype(&cuda_backend::sum_squares_chunks) sum_squares_chunks;
  decltype(&cuda_backend::sum_in_order) sum_in_order;
  decltype(&cuda_backend::scale_chunks) scale_chunks;
  decltype(&cuda_backend::unscale_and_check) unscale_and_check;
  decltype(&cuda_backend::activation_grad) activation_grad;
  decltype(&cuda_backend::cross_entropy_rows) cross_entropy_rows;
  decltype(&cuda_backend::cross_entropy_grad) cross_entropy_grad;
  decltype(&cuda_backend::layer_norm_forward) layer_norm_forward;
  decltype(&cuda_backend::layer_norm_backward) layer_norm_backward;
  decltype(&cuda_backend::gather_rows) gather_rows;
  decltype(&cuda_backend::scatter_add_rows) scatter_add_rows;
  decltype(&cuda_backend::attention_forward) attention_forward;
  decltype(&cuda_backend::attention_backward) attention_backward;
  decltype(&cuda_backend::memory_stats) memory_stats;
  decltype(&cuda_backend::empty_cache) empty_cache;
  decltype(&cuda_backend::allocate_pinned) allocate_pinned;
  decltype(&cuda_backend::release_pinned) release_pinned;
  decltype(&cuda_backend::is_pinned) is_pinned;
  decltype(&cuda_backend::event_record) event_record;
  decltype(&cuda_backend::event_elapsed_ms) event_elapsed_ms;
  decltype(&cuda_backend::event_destroy) event_destroy;
};

// Why the backend could not be loaded (cuda_loader.cpp); empty once it is.
std::string why_unavailable();

}  // namespace troupe::tensor::cuda_backend

// The plugin's one exported symbol (cuda_table.cpp).
extern "C" const troupe::tensor::cuda_backend::Table* troupe_tensor_cuda_table();
