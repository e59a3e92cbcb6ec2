#include "troupe/tensor/caching_allocator.hpp"

#include <algorithm>
#include <bit>
#include <new>

#include "troupe/error.hpp"

namespace troupe::tensor {

namespace {
constexpr std::size_t kSmallGranule = 512;
constexpr std::size_t kSmallLimit = std::size_t{1} << 20;
}  // namespace

CachingAllocator::CachingAllocator(RawAllocate allocate, RawFree free, Limits limits)
    : raw_allocate_(std::move(allocate)), raw_free_(std::move(free)), limits_(limits) {}

CachingAllocator::~CachingAllocator() { empty_cache(); }

std::size_t CachingAllocator::size_class(std::size_t nbytes) {
  if (nbytes == 0) return 0;
  if (nbytes <= kSmallLimit) return (nbytes + kSmallGranule - 1) / kSmallGranule * kSmallGranule;
  // Above 1 MiB: split each power of two [2^k, 2^(k+1)) into four equal steps.
  const std::size_t top = std::bit_floor(nbytes);
  const std::size_t step = top / 4;
  return (nbytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(std::size_t nbytes, int device) {
  if (nbytes == 0) return nullptr;
  const std::size_t size = size_class(nbytes);
  std::lock_guard lock(mutex_);
  DeviceLists& lists = devices_[device];
  decay_locked(lists, device);
  void* data = nullptr;
  if (auto it = lists.free.find(size); it != lists.free.end() && !it->second.empty()) {
    data = it->second.back().data;
    it->second.pop_back();
    ++lists.stats.cache_hits;
  } else {
    data = raw_allocate_(size, device);
    if (data == nullptr) {
      // Out of memory: blocks cached for other sizes may be enough once handed back.
      free_cached_locked(lists, device);
      data = raw_allocate_(size, device);
      if (data == nullptr) throw std::bad_alloc();
    }
    ++lists.stats.device_allocations;
    lists.stats.reserved_bytes += size;
  }
  lists.live.emplace(data, size);
  lists.stats.allocated_bytes += size;
  lists.stats.peak_allocated_bytes = std::max(lists.stats.peak_allocated_bytes, lists.stats.allocated_bytes);
  return data;
}

void CachingAllocator::release(void* data, int device) {
  if (data == nullptr) return;
  std::lock_guard lock(mutex_);
  DeviceLists& lists = devices_[device];
  const auto it = lists.live.find(data);
  TROUPE_CHECK(it != lists.live.end(), "CachingAllocator::release: block ", data, " was not allocated here for device ",
               device, " (or was released twice)");
  const std::size_t size = it->second;
  lists.live.erase(it);
  lists.stats.allocated_bytes -= size;
  const std::size_t cached = lists.stats.reserved_bytes - lists.stats.allocated_bytes;  // this block included
  if (cached > limits_.max_cached_bytes) {
    hand_back_locked(lists, device, data, size);
    return;
  }
  lists.free[size].push_back({data, Clock::now()});
  decay_locked(lists, device);
}

void CachingAllocator::hand_back_locked(DeviceLists& lists, int device, void* data, std::size_t size) {
  raw_free_(data, device);
  ++lists.stats.device_frees;
  lists.stats.reserved_bytes -= size;
}

void CachingAllocator::decay_locked(DeviceLists& lists, int device) {
  if (limits_.max_idle.count() == 0) return;
  // Looked at a few times per max_idle, so a block is handed back within 1.25x of it.
  const Clock::time_point now = Clock::now();
  if (now - lists.swept < limits_.max_idle / 4) return;
  lists.swept = now;
  for (auto& [size, blocks] : lists.free) {
    std::size_t old = 0;
    while (old < blocks.size() && now - blocks[old].since > limits_.max_idle) ++old;
    for (std::size_t i = 0; i < old; ++i) hand_back_locked(lists, device, blocks[i].data, size);
    blocks.erase(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(old));
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  for (auto& [device, lists] : devices_) free_cached_locked(lists, device);
}

CachingAllocator::Stats CachingAllocator::stats(int device) const {
  std::lock_guard lock(mutex_);
  const auto it = devices_.find(device);
  return it == devices_.end() ? Stats{} : it->second.stats;
}

void CachingAllocator::free_cached_locked(DeviceLists& lists, int device) {
  for (auto& [size, blocks] : lists.free) {
    for (const Cached& block : blocks) hand_back_locked(lists, device, block.data, size);
    blocks.clear();
  }
}

}  // namespace troupe::tensor
