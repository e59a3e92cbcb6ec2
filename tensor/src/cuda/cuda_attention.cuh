// What both causal-attention paths on CUDA share: the shape and dropout of one call as
// the kernels read it, the dropout multiplier of a score (the same Philox word the CPU
// draws), and the launch over (batch x head, row tiles).
//   cuda_attention.cu       f32 and f64, and any head size: a thread per row, CUDA cores
//   cuda_attention_mma.cu   bf16: a warp per 16 rows, tensor cores (mma.sync)
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "../philox.hpp"
#include "cuda_device.cuh"

namespace troupe::tensor::cuda_backend::attention {

struct Geometry {
  std::int64_t time, channels, heads, head_dim;
  double scale;  // 1 / sqrt(head_dim)
  double dropout;
  float keep;  // 1 - dropout, as the CPU compares it
  std::uint64_t seed, offset;
};

inline Geometry geometry_of(const AttentionShape& s, const AttentionDropout& drop) {
  return {s.time,  s.channels, s.heads, s.head_dim, 1.0 / std::sqrt(static_cast<double>(s.head_dim)),
          drop.p,  static_cast<float>(1.0 - drop.p), drop.seed, drop.offset};
}

// The dropout multiplier of score (i, j) of head bh: 0 or 1 / keep. Score (i, j) of
// head bh draws Philox word (bh * T + i) * T + j, as the CPU does.
template <class A>
__device__ inline A dropout_factor(const Geometry& g, std::int64_t bh, std::int64_t i, std::int64_t j) {
  const auto index = static_cast<std::uint64_t>((bh * g.time + i) * g.time + j);
  const float u = static_cast<float>(detail::philox_uniform(g.seed, g.offset, index));
  return u < g.keep ? static_cast<A>(1.0 / (1.0 - g.dropout)) : A(0);
}

// Launches `kernel` over (B * H, row tiles of `rows`) with `threads` per block and
// `bytes` of dynamic shared memory, above the 48 KB a launch gets unasked where the
// tiles need it.
template <class Kernel, class... Args>
void launch(Kernel kernel, const AttentionShape& s, int rows, int threads, std::size_t bytes, const char* what,
            Args... args) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
             what, __FILE__, __LINE__);
  const dim3 grid(static_cast<unsigned>(s.batch * s.heads), static_cast<unsigned>((s.time + rows - 1) / rows));
  kernel<<<grid, threads, bytes>>>(args...);
  finish(what);
}

// bf16 on tensor cores (cuda_attention_mma.cu); head_dim <= 128.
void forward_bf16(const BFloat16* qkv, const AttentionShape& s, const AttentionDropout& drop, BFloat16* out,
                  float* lse);
void backward_bf16(const BFloat16* qkv, const BFloat16* out, const BFloat16* grad_out, const float* lse,
                   const AttentionShape& s, const AttentionDropout& drop, float* delta, BFloat16* grad_qkv);

}  // namespace troupe::tensor::cuda_backend::attention
