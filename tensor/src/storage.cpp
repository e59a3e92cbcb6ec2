#include "troupe/tensor/storage.hpp"

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>

#include "cuda/cuda_backend.hpp"
#include "troupe/tensor/caching_allocator.hpp"
#include "troupe/tensor/host_memory.hpp"

namespace troupe::tensor {

namespace {
constexpr std::size_t kHostAlignment = 64;
// Buffers this large come straight from mmap and are unmapped when freed, so every
// fresh tensor pays a page fault per 4 KiB (a 64 MB add ran at 1 GB/s, bound by
// faults). Aligned to a huge page and marked for transparent huge pages (which
// Debian's default "madvise" mode grants only when asked), they fault 512x less.
constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Blocks kept when freed (host_memory.hpp): an activation's sizes, not a model's or a
// checkpoint's buffers, which would hold their memory long after the phase that used
// them. ASan must see a block used after it was freed.
constexpr std::size_t kCachedMin = std::size_t{64} << 10;
constexpr std::size_t kCachedMax = std::size_t{8} << 20;
constexpr CachingAllocator::Limits kCacheLimits{.max_cached_bytes = std::size_t{256} << 20,
                                                .max_idle = std::chrono::seconds(2)};
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCaching = false;
#else
constexpr bool kCaching = true;
#endif

// Process-wide, as the allocator they describe is.
std::atomic<std::size_t> g_live{0};
std::atomic<std::size_t> g_peak{0};

void count_allocation(std::size_t nbytes) {
  const std::size_t live = g_live.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  std::size_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}
// Only the whole huge pages are advised: a tail advised too would be faulted in as a
// full 2 MB page, up to 2 MB of resident memory per tensor that nothing uses (100 MB
// over the 48 shards of a sharded resume).
void* allocate_host(std::size_t nbytes) {
  const std::size_t alignment = nbytes >= kHugePage ? kHugePage : kHostAlignment;
  const std::size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* data = nullptr;
  if (posix_memalign(&data, alignment, rounded == 0 ? kHostAlignment : rounded) != 0) return nullptr;
  if (alignment == kHugePage) madvise(data, nbytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice only
  return data;
}

// Never destroyed: a tensor held by another static object may be freed after it would be.
CachingAllocator& host_cache() {
  static auto* cache = new CachingAllocator([](std::size_t nbytes, int) { return allocate_host(nbytes); },
                                            [](void* p, int) { std::free(p); }, kCacheLimits);
  return *cache;
}

bool cached_size(std::size_t nbytes) { return kCaching && nbytes >= kCachedMin && nbytes <= kCachedMax; }

}  // namespace

HostMemoryStats host_memory_stats() {
  const CachingAllocator::Stats cache = host_cache().stats(0);
  return {g_live.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed),
          cache.reserved_bytes - cache.allocated_bytes};
}

void reset_host_memory_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

void empty_host_cache() { host_cache().empty_cache(); }

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device) {
  check_device_usable(device, "allocate");
  if (device.is_meta()) return std::shared_ptr<Storage>(new Storage(nullptr, nbytes, device, nullptr));
  if (device.is_cuda()) {
    const int index = device.index;
    void* data = cuda_backend::allocate(nbytes, index);
    return std::shared_ptr<Storage>(
        new Storage(data, nbytes, device, [index](void* p) { cuda_backend::release(p, index); }));
  }
  if (cached_size(nbytes)) {
    void* data = host_cache().allocate(nbytes, 0);
    count_allocation(nbytes);
    return std::shared_ptr<Storage>(new Storage(data, nbytes, device, [nbytes](void* p) {
      host_cache().release(p, 0);
      g_live.fetch_sub(nbytes, std::memory_order_relaxed);
    }));
  }
  // A non-zero size, so that every storage has a distinct address.
  void* data = allocate_host(nbytes);
  if (data == nullptr) throw std::bad_alloc();
  count_allocation(nbytes);
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, [nbytes](void* p) {
    std::free(p);
    g_live.fetch_sub(nbytes, std::memory_order_relaxed);
  }));
}

std::shared_ptr<Storage> Storage::adopt(void* data, std::size_t nbytes, Device device, Deleter deleter) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, std::move(deleter)));
}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

}  // namespace troupe::tensor
