// OffloadMemory: host memory kept apart from the tensors compute uses, for FSDP's CPU
// offload (parameter shards, their gradients and the optimizer state live here; the
// step runs here; only gathered parameters and full gradients live on the compute
// device).
//
// For a GPU's offload (the compute device is CUDA) each allocation is page-locked
// memory from cudaHostAlloc, which the GPU copies to and from by DMA, without staging
// through a bounce buffer. Otherwise each is its own anonymous mmap (page-aligned,
// outside the malloc heap), mlock'ed when the process may lock that much
// (RLIMIT_MEMLOCK) so the kernel never swaps it. When locking is refused the memory is
// still the pool's, just not pinned; pinned_bytes() says which. Tensors allocated here free their pages when the last
// handle goes away, also after the pool object itself is gone (the counters are shared).
//
// Thread-safe: allocation and release take a mutex.
#pragma once

#include <cstddef>
#include <memory>

#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel {

class OffloadMemory {
 public:
  // `compute`: the device the pool's tensors are copied to and from.
  explicit OffloadMemory(tensor::Device compute = tensor::Device::cpu());

  tensor::Tensor empty(const tensor::Shape& shape, tensor::DType dtype);
  tensor::Tensor zeros(const tensor::Shape& shape, tensor::DType dtype);

  // Bytes requested by the live allocations, bytes mapped for them (whole pages), the
  // mapped bytes that are also locked, and the most requested bytes ever live at once.
  std::size_t bytes() const;
  std::size_t mapped_bytes() const;
  std::size_t pinned_bytes() const;
  std::size_t peak_bytes() const;
  // True when `t` views memory this pool allocated (and that is still live).
  bool owns(const tensor::Tensor& t) const;

  struct Counters;

 private:
  std::shared_ptr<Counters> counters_;
  tensor::Device compute_;
};

}  // namespace troupe::parallel
