// Device memory through one process-wide CachingAllocator over cudaMalloc/cudaFree,
// and page-locked host memory through cudaHostAlloc.
#include <cstdio>
#include <exception>
#include <new>

#include "cuda_backend.hpp"
#include "cuda_check.hpp"

namespace troupe::tensor::cuda_backend {

namespace {

CachingAllocator& allocator() {
  // Never destroyed: tensors held in static objects are released after main returns,
  // possibly after the CUDA runtime has shut down, so the cache is left to the driver,
  // which frees a process's memory when it exits.
  static auto* instance = new CachingAllocator(
      [](std::size_t nbytes, int device) -> void* {
        TROUPE_CUDA_CHECK(cudaSetDevice(device));
        void* p = nullptr;
        const cudaError_t status = cudaMalloc(&p, nbytes);
        if (status == cudaErrorMemoryAllocation) {
          cudaGetLastError();  // clear the sticky error: the allocator retries after emptying its cache
          return nullptr;
        }
        TROUPE_CUDA_CHECK(status);
        return p;
      },
      [](void* p, int device) {
        cudaSetDevice(device);
        cudaFree(p);  // called from release paths that must not throw
      });
  return *instance;
}

}  // namespace

void* allocate(std::size_t nbytes, int device) {
  // Kernels run on the current device; a cache hit must make it this block's device
  // just as a cudaMalloc would have.
  TROUPE_CUDA_CHECK(cudaSetDevice(device));
  try {
    return allocator().allocate(nbytes, device);
  } catch (const std::bad_alloc&) {
    const auto s = allocator().stats(device);
    TROUPE_THROW(Error, "CUDA: out of memory on cuda:", device, " allocating ", nbytes, " bytes (",
                 CachingAllocator::size_class(nbytes), " with rounding); ", s.allocated_bytes,
                 " bytes live in troupe's tensors, cache already emptied");
  }
}

void release(void* data, int device) {
  // Called from Storage's destructor, which must not throw: a block the allocator does
  // not know is a bug in troupe, reported and leaked rather than crashing the process.
  try {
    allocator().release(data, device);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
  }
}

CachingAllocator::Stats memory_stats(int device) { return allocator().stats(device); }

void empty_cache() { allocator().empty_cache(); }

void* allocate_pinned(std::size_t nbytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, nbytes, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void release_pinned(void* data) { cudaFreeHost(data); }

bool is_pinned(const void* data) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

}  // namespace troupe::tensor::cuda_backend
