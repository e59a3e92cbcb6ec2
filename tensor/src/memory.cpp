// The public face of cuda_memory.hpp; the CUDA calls are in cuda/cuda_memory.cpp, in
// the plugin (cuda/cuda_table.hpp).
#include "cuda/cuda_backend.hpp"
#include "troupe/tensor/cuda_memory.hpp"

namespace troupe::tensor {

CachingAllocator::Stats cuda_memory_stats(Device device) {
  TROUPE_CHECK(device.is_cuda(), "cuda_memory_stats: ", device, " is not a CUDA device");
  return cuda_backend::memory_stats(device.index);
}

void cuda_empty_cache() { cuda_backend::empty_cache(); }

Tensor pinned_empty(const Shape& shape, DType dtype) {
  const std::size_t nbytes = static_cast<std::size_t>(shape_numel(shape)) * element_size(dtype);
  void* data = cuda_available() && nbytes > 0 ? cuda_backend::allocate_pinned(nbytes) : nullptr;
  if (data == nullptr) return Tensor::empty(shape, dtype);  // nothing to pin for: ordinary memory
  auto storage = Storage::adopt(data, nbytes, Device::cpu(), [](void* p) { cuda_backend::release_pinned(p); });
  return Tensor::from_storage(std::move(storage), shape, dtype);
}

bool is_pinned(const Tensor& t) {
  return t.defined() && t.device().is_cpu() && cuda_available() && cuda_backend::is_pinned(t.raw_data());
}

}  // namespace troupe::tensor
