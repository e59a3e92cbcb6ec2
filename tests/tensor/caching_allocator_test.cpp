// The caching allocator's bookkeeping with a fake backend (runs everywhere), and the
// real one under CUDA tensors and pinned host memory (skipped without a GPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <new>
#include <thread>

#include "gpu_compare.hpp"
#include "troupe/tensor/caching_allocator.hpp"
#include "troupe/tensor/cuda_memory.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::tensor;

namespace {

// malloc/free behind a byte limit, counting what the allocator asks of it.
struct FakeDevice {
  std::size_t limit = std::size_t{1} << 30;
  std::size_t held = 0;
  std::map<void*, std::size_t> blocks;
  int allocations = 0, frees = 0;

  CachingAllocator make(CachingAllocator::Limits limits = {}) {
    return CachingAllocator(
        [this](std::size_t n, int) -> void* {
          if (held + n > limit) return nullptr;
          held += n;
          ++allocations;
          void* p = std::malloc(n);
          blocks[p] = n;
          return p;
        },
        [this](void* p, int) {
          ++frees;
          held -= blocks.at(p);
          blocks.erase(p);
          std::free(p);
        },
        limits);
  }
};

}  // namespace

TEST(CachingAllocator, RoundsSmallRequestsTo512BytesAndLargeOnesToQuarterPowersOfTwo) {
  EXPECT_EQ(CachingAllocator::size_class(0), 0u);
  EXPECT_EQ(CachingAllocator::size_class(1), 512u);
  EXPECT_EQ(CachingAllocator::size_class(512), 512u);
  EXPECT_EQ(CachingAllocator::size_class(513), 1024u);
  EXPECT_EQ(CachingAllocator::size_class(1u << 20), 1u << 20);
  EXPECT_EQ(CachingAllocator::size_class((1u << 20) + 1), (1u << 20) + (1u << 18));
  EXPECT_EQ(CachingAllocator::size_class(3u << 20), 3u << 20);
  EXPECT_EQ(CachingAllocator::size_class((100u << 20) + 5), 112u << 20);
}

TEST(CachingAllocator, AReleasedBlockServesTheNextRequestOfItsClass) {
  FakeDevice device;
  CachingAllocator allocator = device.make();
  void* a = allocator.allocate(1000, 0);
  allocator.release(a, 0);
  void* b = allocator.allocate(900, 0);  // same 1024-byte class
  EXPECT_EQ(a, b);
  void* c = allocator.allocate(5000, 0);  // another class: a new block
  EXPECT_NE(c, b);
  const auto s = allocator.stats(0);
  EXPECT_EQ(s.device_allocations, 2u);
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.allocated_bytes, 1024u + 5120u);
  EXPECT_EQ(s.reserved_bytes, 1024u + 5120u);
  EXPECT_EQ(device.allocations, 2);
  allocator.release(b, 0);
  allocator.release(c, 0);
  EXPECT_EQ(allocator.stats(0).allocated_bytes, 0u);
  EXPECT_EQ(allocator.stats(0).peak_allocated_bytes, 1024u + 5120u);
}

TEST(CachingAllocator, DevicesKeepSeparateLists) {
  FakeDevice device;
  CachingAllocator allocator = device.make();
  allocator.release(allocator.allocate(100, 0), 0);
  void* other = allocator.allocate(100, 1);
  EXPECT_EQ(allocator.stats(1).cache_hits, 0u);
  EXPECT_EQ(allocator.stats(1).device_allocations, 1u);
  allocator.release(other, 1);
}

TEST(CachingAllocator, EmptyCacheHandsFreeBlocksBackAndKeepsLiveOnes) {
  FakeDevice device;
  CachingAllocator allocator = device.make();
  void* live = allocator.allocate(2048, 0);
  allocator.release(allocator.allocate(4096, 0), 0);
  allocator.empty_cache();
  EXPECT_EQ(device.frees, 1);
  const auto s = allocator.stats(0);
  EXPECT_EQ(s.reserved_bytes, 2048u);
  EXPECT_EQ(s.allocated_bytes, 2048u);
  EXPECT_EQ(s.device_frees, 1u);
  allocator.release(live, 0);
}

TEST(CachingAllocator, OutOfMemoryEmptiesTheCacheAndRetriesOnce) {
  FakeDevice device;
  device.limit = 8192;
  CachingAllocator allocator = device.make();
  allocator.release(allocator.allocate(6000, 0), 0);  // 6144 cached
  void* big = allocator.allocate(8000, 0);            // 8192 fits only once the cache is gone
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(device.frees, 1);
  EXPECT_THROW(allocator.allocate(1, 0), std::bad_alloc);  // still full: nothing cached to give back
  allocator.release(big, 0);
}

// The host's limits (storage.cpp): a release past max_cached_bytes goes straight back,
// and a block left unused past max_idle is handed back by a later call.
TEST(CachingAllocator, LimitsBoundTheCacheInBytesAndInTime) {
  FakeDevice device;
  CachingAllocator alloc = device.make({.max_cached_bytes = 2048, .max_idle = std::chrono::milliseconds(40)});
  void* a = alloc.allocate(1024, 0);
  void* b = alloc.allocate(1024, 0);
  void* c = alloc.allocate(1024, 0);
  alloc.release(a, 0);
  alloc.release(b, 0);
  EXPECT_EQ(device.frees, 0);
  alloc.release(c, 0);  // a third KiB would pass 2 KiB cached
  EXPECT_EQ(device.frees, 1);
  EXPECT_EQ(alloc.stats(0).reserved_bytes, 2048u);
  void* again = alloc.allocate(1024, 0);  // reused, not decayed yet
  EXPECT_EQ(device.allocations, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  void* other = alloc.allocate(4096, 0);  // notices the idle block
  EXPECT_EQ(device.frees, 2);
  EXPECT_EQ(alloc.stats(0).reserved_bytes, 1024u + 4096u);
  alloc.release(again, 0);
  alloc.release(other, 0);
}

TEST(CachingAllocator, ReleasingAForeignPointerIsAnError) {
  FakeDevice device;
  CachingAllocator allocator = device.make();
  int not_ours = 0;
  EXPECT_THROW(allocator.release(&not_ours, 0), InvalidArgument);
  allocator.release(nullptr, 0);  // ignored, like free(nullptr)
}

TEST(CachingAllocator, PinnedMemoryFallsBackToOrdinaryHostMemoryWithoutAGpu) {
  if (cuda_available()) GTEST_SKIP() << "this machine has a GPU: CudaMemory.PinnedHostTensorsArePageLocked covers it";
  Tensor t = pinned_empty({4, 3});
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_FALSE(is_pinned(t));
  t.fill_(2);
  EXPECT_EQ(t.to_vector<float>()[11], 2.0f);
}

TEST(CudaMemory, ASteadyLoopStopsCallingCudaMallocAfterItsFirstStep) {
  TROUPE_SKIP_WITHOUT_GPU();
  Generator g(1);
  const Tensor x = normal({256, 512}, 0, 1, g).to(Device::cuda());
  const auto step = [&] { return sum(add(mul(x, 2.0), x)).item(); };
  step();
  const auto before = cuda_memory_stats();
  for (int i = 0; i < 10; ++i) step();
  const auto after = cuda_memory_stats();
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_GT(after.cache_hits, before.cache_hits);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);  // nothing leaked per step
  cuda_empty_cache();
  const auto emptied = cuda_memory_stats();
  EXPECT_EQ(emptied.reserved_bytes, emptied.allocated_bytes);
}

TEST(CudaMemory, PinnedHostTensorsArePageLockedAndCopyBothWays) {
  TROUPE_SKIP_WITHOUT_GPU();
  Generator g(2);
  const Tensor x = normal({1000}, 0, 1, g);
  Tensor pinned = pinned_empty({1000});
  EXPECT_TRUE(is_pinned(pinned));
  EXPECT_FALSE(is_pinned(x));
  pinned.copy_(x);
  const Tensor on_gpu = pinned.to(Device::cuda());
  Tensor back = pinned_empty({1000});
  back.copy_(on_gpu);
  EXPECT_TRUE(equal(back, x));
}
