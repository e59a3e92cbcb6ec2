// Device memory and pinned host memory.
//
// CUDA tensors take their bytes from a per-process CachingAllocator
// (caching_allocator.hpp): a freed tensor's block is kept for the next tensor of its
// size class, so a steady training loop stops calling cudaMalloc after its first step.
// These functions report on it and empty it.
//
// Pinned (page-locked) host tensors are what a device<->host copy can DMA from
// directly: use them for staging copies and checkpoint snapshots. Without CUDA (or
// without a device) `pinned_empty` returns ordinary host memory and `is_pinned` says so.
#pragma once

#include "troupe/tensor/caching_allocator.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor {

// Counters of the device's caching allocator; all zero before its first allocation
// and in a build without CUDA.
CachingAllocator::Stats cuda_memory_stats(Device device = Device::cuda());
// Hands every cached (free) block of every device back to the driver; live tensors
// keep theirs. For a phase change (evaluation after training) or before another
// library needs the memory.
void cuda_empty_cache();

// A CPU tensor in page-locked memory (cudaHostAlloc), freed with cudaFreeHost.
Tensor pinned_empty(const Shape& shape, DType dtype = DType::f32);
// True when t's storage is page-locked host memory.
bool is_pinned(const Tensor& t);

}  // namespace troupe::tensor
