// Device memory through one process-wide CachingAllocator over cudaMalloc/cudaFree,
// page-locked host memory through cudaHostAlloc, and copies between host and device.
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
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

// Small uploads from pageable memory, made asynchronous. cudaMemcpy from pageable
// memory first waits for everything queued on the stream, so each upload of a step's
// token ids or an embedding's row lists emptied the GPU's queue, and the GPU then
// idled while the host launched the next kernels. Here the bytes are copied into a
// ring of page-locked memory before upload() returns, and cudaMemcpyAsync queues the
// rest behind the kernels already queued. A region of the ring is reused only once the
// event recorded after its copy has passed.
class UploadRing {
 public:
  static constexpr std::size_t kCapacity = std::size_t{8} << 20;
  static constexpr std::size_t kLargest = std::size_t{1} << 20;  // larger uploads stay synchronous

  // False when the ring could not be set up (no page-locked memory): the caller copies
  // synchronously instead.
  bool upload(void* dst, const void* src, std::size_t nbytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (base_ == nullptr && !set_up()) return false;
    const std::size_t size = (nbytes + 255) / 256 * 256;
    std::size_t start = head_;
    if (start + size > kCapacity) start = 0;
    // Copies that have finished leave the list; then every copy up to the newest one
    // still reading [start, start + size) is waited for, oldest first.
    while (!in_flight_.empty() && cudaEventQuery(in_flight_.front().done) == cudaSuccess) retire_oldest();
    std::size_t overlapping = 0;
    for (std::size_t i = 0; i < in_flight_.size(); ++i)
      if (in_flight_[i].begin < start + size && start < in_flight_[i].end) overlapping = i + 1;
    for (; overlapping > 0; --overlapping) {
      const cudaError_t status = cudaEventSynchronize(in_flight_.front().done);
      retire_oldest();
      TROUPE_CUDA_CHECK(status);
    }
    std::memcpy(base_ + start, src, nbytes);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, base_ + start, nbytes, cudaMemcpyHostToDevice, nullptr));
    cudaEvent_t done = nullptr;
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(done, nullptr);
    if (recorded != cudaSuccess) {
      cudaEventDestroy(done);
      TROUPE_CUDA_CHECK(recorded);
    }
    in_flight_.push_back({start, start + size, done});
    head_ = start + size;
    return true;
  }

 private:
  struct InFlight {
    std::size_t begin, end;
    cudaEvent_t done;
  };

  void retire_oldest() {
    cudaEventDestroy(in_flight_.front().done);
    in_flight_.pop_front();
  }

  bool set_up() {
    // Portable: the ring serves whichever device is current at each upload.
    if (cudaHostAlloc(reinterpret_cast<void**>(&base_), kCapacity, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      base_ = nullptr;
      return false;
    }
    return true;
  }

  std::mutex mutex_;
  char* base_ = nullptr;
  std::size_t head_ = 0;
  std::deque<InFlight> in_flight_;
};

UploadRing& upload_ring() {
  static auto* ring = new UploadRing;  // never destroyed, as the allocator
  return *ring;
}

}  // namespace

void copy(void* dst, const void* src, std::size_t nbytes, CopyKind kind) {
  if (kind == CopyKind::host_to_device && nbytes > 0 && nbytes <= UploadRing::kLargest &&
      upload_ring().upload(dst, src, nbytes))
    return;
  const cudaMemcpyKind k = kind == CopyKind::host_to_device   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
  TROUPE_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, k));
}

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
