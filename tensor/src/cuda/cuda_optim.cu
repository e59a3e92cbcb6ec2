// Fused optimizer steps and GradScaler's unscale + inf check over flat f32 buffers:
// one launch reads each element's parameter, gradient and state once and writes them
// once, where separate tensor ops would make a pass per term. The arithmetic is
// optim_step.hpp's, which the host loop (fused_optim.cpp) runs too. And clipping's
// sum of squares over a list of gradients, a partial per chunk summed in a fixed order,
// and its scaling of the list.
#include <cub/block/block_reduce.cuh>

#include "cuda_device.cuh"

namespace troupe::tensor::cuda_backend {

namespace {

__global__ void sgd_kernel(float* p, const float* g, float* b, std::int64_t n, SgdScalars s) {
  TROUPE_GRID_LOOP(i, n) detail::sgd_element(p[i], g[i], b == nullptr ? nullptr : b + i, s);
}

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, std::int64_t n, AdamScalars s) {
  TROUPE_GRID_LOOP(i, n) detail::adam_element(p[i], g[i], m[i], v[i], s);
}

// Every thread that meets a non-finite value writes 1; no atomics are needed because
// all writers write the same value, and nobody writes 0 here (the flag accumulates
// over the buffers of one step, as PyTorch's found_inf does).
// Block b steps chunk chunk_of[b] of tensor tensor_of[b]: its tensor and element range.
constexpr int kListThreads = 512;

struct BlockChunk {
  int t;
  std::int64_t begin, end;
};

template <class List>
__device__ inline BlockChunk block_chunk(const List& list) {
  const int t = list.tensor_of[blockIdx.x];
  const std::int64_t begin = std::int64_t{list.chunk_of[blockIdx.x]} * kListChunk;
  return {t, begin, begin + kListChunk < list.n[t] ? begin + kListChunk : list.n[t]};
}

// Four elements per access where the four buffers allow it: one float per thread kept
// too few bytes in flight, and the step ran at about half the memory's rate. The
// arithmetic per element is the same.
__global__ void __launch_bounds__(kListThreads) adam_list_kernel(const __grid_constant__ AdamList list) {
  const auto [t, begin, end] = block_chunk(list);
  float* p = list.param[t];
  const float* g = list.grad[t];
  float* m = list.exp_avg[t];
  float* v = list.exp_avg_sq[t];
  const AdamScalars s = list.scalars[t];
  std::int64_t first = begin;  // the first element left to the one-at-a-time loop
  if (aligned16(p + begin) && aligned16(g + begin) && aligned16(m + begin) && aligned16(v + begin)) {
    const std::int64_t packs = (end - begin) / 4;
    for (std::int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      const std::int64_t i = begin + 4 * k;
      float4 pp = *reinterpret_cast<const float4*>(p + i), mm = *reinterpret_cast<const float4*>(m + i),
             vv = *reinterpret_cast<const float4*>(v + i);
      const float4 gg = *reinterpret_cast<const float4*>(g + i);
      detail::adam_element(pp.x, gg.x, mm.x, vv.x, s);
      detail::adam_element(pp.y, gg.y, mm.y, vv.y, s);
      detail::adam_element(pp.z, gg.z, mm.z, vv.z, s);
      detail::adam_element(pp.w, gg.w, mm.w, vv.w, s);
      *reinterpret_cast<float4*>(p + i) = pp;
      *reinterpret_cast<float4*>(m + i) = mm;
      *reinterpret_cast<float4*>(v + i) = vv;
    }
    first = begin + 4 * packs;
  }
  for (std::int64_t i = first + threadIdx.x; i < end; i += blockDim.x) detail::adam_element(p[i], g[i], m[i], v[i], s);
}

__global__ void __launch_bounds__(kListThreads) sgd_list_kernel(const __grid_constant__ SgdList list) {
  const auto [t, begin, end] = block_chunk(list);
  float* p = list.param[t];
  const float* g = list.grad[t];
  float* b = list.momentum_buffer[t];
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    detail::sgd_element(p[i], g[i], b == nullptr ? nullptr : b + i, list.scalars[t]);
}

using BlockSum = cub::BlockReduce<double, kListThreads>;

__global__ void __launch_bounds__(kListThreads)
    squares_list_kernel(const __grid_constant__ SquaresList list, double* partials) {
  __shared__ typename BlockSum::TempStorage scratch;
  const auto [t, begin, end] = block_chunk(list);
  const float* x = list.data[t];
  double sum = 0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = x[i];
    sum += v * v;
  }
  const double total = BlockSum(scratch).Sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kListThreads) sum_in_order_kernel(const double* values, std::int64_t n, double* out) {
  __shared__ typename BlockSum::TempStorage scratch;
  double sum = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += values[i];
  const double total = BlockSum(scratch).Sum(sum);
  if (threadIdx.x == 0) *out = total;
}

// Four elements per access where the chunk allows, as adam_list_kernel; the product is
// scale's, so the bits are those of scale_ on each tensor.
__global__ void __launch_bounds__(kListThreads)
    scale_list_kernel(const __grid_constant__ ScaleList list, float factor) {
  const auto [t, begin, end] = block_chunk(list);
  float* x = list.data[t];
  std::int64_t first = begin;
  if (aligned16(x + begin)) {
    const std::int64_t packs = (end - begin) / 4;
    for (std::int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      float4 v = *reinterpret_cast<const float4*>(x + begin + 4 * k);
      v.x *= factor;
      v.y *= factor;
      v.z *= factor;
      v.w *= factor;
      *reinterpret_cast<float4*>(x + begin + 4 * k) = v;
    }
    first = begin + 4 * packs;
  }
  for (std::int64_t i = first + threadIdx.x; i < end; i += blockDim.x) x[i] *= factor;
}

__global__ void unscale_kernel(float* g, std::int64_t n, float inv_scale, float* found_inf) {
  TROUPE_GRID_LOOP(i, n) detail::unscale_element(g[i], inv_scale, *found_inf);
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buffer, std::int64_t n, const SgdScalars& s) {
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads>>>(param, grad, momentum_buffer, n, s);
  finish("fused SGD step");
}

void adam_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, std::int64_t n,
               const AdamScalars& s) {
  if (n == 0) return;
  adam_kernel<<<blocks_for(n), kThreads>>>(param, grad, exp_avg, exp_avg_sq, n, s);
  finish("fused Adam step");
}

void adam_steps(const AdamList& list) {
  if (list.blocks == 0) return;
  adam_list_kernel<<<list.blocks, kListThreads>>>(list);
  finish("fused Adam steps");
}

void sgd_steps(const SgdList& list) {
  if (list.blocks == 0) return;
  sgd_list_kernel<<<list.blocks, kListThreads>>>(list);
  finish("fused SGD steps");
}

void sum_squares_chunks(const SquaresList& list, double* partials) {
  if (list.blocks == 0) return;
  squares_list_kernel<<<list.blocks, kListThreads>>>(list, partials);
  finish("sum of squares");
}

void sum_in_order(const double* values, std::int64_t n, double* out) {
  sum_in_order_kernel<<<1, kListThreads>>>(values, n, out);
  finish("sum");
}

void scale_chunks(const ScaleList& list, float factor) {
  if (list.blocks == 0) return;
  scale_list_kernel<<<list.blocks, kListThreads>>>(list, factor);
  finish("scale of a list");
}

void unscale_and_check(float* grad, std::int64_t n, float inv_scale, float* found_inf) {
  if (n == 0) return;
  unscale_kernel<<<blocks_for(n), kThreads>>>(grad, n, inv_scale, found_inf);
  finish("fused unscale and inf check");
}

}  // namespace troupe::tensor::cuda_backend
