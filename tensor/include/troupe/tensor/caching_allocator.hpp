// CachingAllocator: keeps freed device blocks for reuse, so a training step that
// allocates the same tensors every iteration calls the driver (cudaMalloc, which
// synchronises the device and costs tens of microseconds) only in its first step.
//
// Requests are rounded up to a size class and a released block goes onto its class's
// free list for that device; the next request of the class takes it back. Classes are
// 512-byte multiples below 1 MiB and, above, four steps per power of two (at most 25%
// slack), so a few dozen lists cover every size a model asks for. When the backend
// reports out of memory, every cached block of that device is handed back and the
// request is tried once more. `empty_cache()` hands every cached block back. Limits
// (the host's cache in storage.cpp sets both): a released block that would take a
// device's cache past max_cached_bytes is handed back at once, and a block cached for
// longer than max_idle is handed back by the next call that notices (jemalloc's decay:
// a steady loop reuses its blocks every step; a phase that has ended lets go of them).
//
// The allocator knows nothing of CUDA: the raw allocate/free functions are passed in
// (cuda_memory.cpp passes cudaMalloc/cudaFree; tests pass malloc/free). Reuse is safe
// because every kernel troupe launches runs on the default stream and is waited for
// before the call returns; when work moves onto side streams, a block must also
// remember the streams that used it (as PyTorch's recordStream) before reuse.
//
// Thread-safe: one mutex around the lists and counters.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace troupe::tensor {

struct CachingLimits {
  std::size_t max_cached_bytes = std::numeric_limits<std::size_t>::max();
  std::chrono::milliseconds max_idle{0};  // 0: forever
};

class CachingAllocator {
 public:
  // allocate returns nullptr when the device is out of memory (anything else it may throw).
  using RawAllocate = std::function<void*(std::size_t nbytes, int device)>;
  using RawFree = std::function<void(void* data, int device)>;

  struct Stats {
    std::size_t allocated_bytes = 0;       // in live blocks (class sizes)
    std::size_t reserved_bytes = 0;        // live + cached, i.e. what the backend holds for us
    std::size_t peak_allocated_bytes = 0;  // the most ever live at once
    std::uint64_t device_allocations = 0;  // raw allocate calls that succeeded
    std::uint64_t cache_hits = 0;          // requests served from a free list
    std::uint64_t device_frees = 0;        // raw free calls (empty_cache, out-of-memory retry)
  };

  using Limits = CachingLimits;

  CachingAllocator(RawAllocate allocate, RawFree free, Limits limits = {});
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  // Hands every cached block back; live blocks are the caller's (a leak report, not a free).
  ~CachingAllocator();

  // The bytes a request of `nbytes` really takes.
  static std::size_t size_class(std::size_t nbytes);

  // nullptr for 0 bytes. Throws std::bad_alloc naming nothing when the backend is
  // still out of memory after the cache was emptied (cuda_memory.cpp adds the device).
  void* allocate(std::size_t nbytes, int device);
  // Puts a block from allocate() back on its free list; nullptr is ignored. A pointer
  // this allocator did not hand out is an error (InvalidArgument).
  void release(void* data, int device);
  // Returns every cached block of every device to the backend.
  void empty_cache();
  Stats stats(int device) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Cached {
    void* data;
    Clock::time_point since;
  };
  struct DeviceLists {
    std::unordered_map<std::size_t, std::vector<Cached>> free;  // class size -> cached blocks, oldest first
    Clock::time_point swept{};
    std::unordered_map<void*, std::size_t> live;  // block -> class size
    Stats stats;
  };
  void free_cached_locked(DeviceLists& lists, int device);
  void hand_back_locked(DeviceLists& lists, int device, void* data, std::size_t size);
  void decay_locked(DeviceLists& lists, int device);

  RawAllocate raw_allocate_;
  RawFree raw_free_;
  Limits limits_;
  mutable std::mutex mutex_;
  std::unordered_map<int, DeviceLists> devices_;
};

}  // namespace troupe::tensor
