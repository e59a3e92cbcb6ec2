#include "troupe/tensor/storage.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "cuda/cuda_backend.hpp"
#include "troupe/tensor/host_memory.hpp"

namespace troupe::tensor {

namespace {
constexpr std::size_t kHostAlignment = 64;
// Buffers this large come straight from mmap and are unmapped when freed, so every
// fresh tensor pays a page fault per 4 KiB (a 64 MB add ran at 1 GB/s, bound by
// faults). Aligned to a huge page and marked for transparent huge pages (which
// Debian's default "madvise" mode grants only when asked), they fault 512x less.
constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Process-wide, as the allocator they describe is.
std::atomic<std::size_t> g_live{0};
std::atomic<std::size_t> g_peak{0};

void count_allocation(std::size_t nbytes) {
  const std::size_t live = g_live.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  std::size_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}
}  // namespace

HostMemoryStats host_memory_stats() {
  return {g_live.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed)};
}

void reset_host_memory_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device) {
  check_device_usable(device, "allocate");
  if (device.is_meta()) return std::shared_ptr<Storage>(new Storage(nullptr, nbytes, device, nullptr));
  if (device.is_cuda()) {
    const int index = device.index;
    void* data = cuda_backend::allocate(nbytes, index);
    return std::shared_ptr<Storage>(
        new Storage(data, nbytes, device, [index](void* p) { cuda_backend::release(p, index); }));
  }
  // A non-zero size, so that every storage has a distinct address.
  // Only the whole huge pages are advised: a tail advised too would be faulted in as a
  // full 2 MB page, up to 2 MB of resident memory per tensor that nothing uses (100 MB
  // over the 48 shards of a sharded resume).
  const std::size_t alignment = nbytes >= kHugePage ? kHugePage : kHostAlignment;
  const std::size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* data = nullptr;
  if (posix_memalign(&data, alignment, rounded == 0 ? kHostAlignment : rounded) != 0) throw std::bad_alloc();
  if (alignment == kHugePage) madvise(data, nbytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice only
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
