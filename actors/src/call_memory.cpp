#include "troupe/actors/detail/call_memory.hpp"

#include <array>
#include <atomic>
#include <new>
#include <utility>

#include "troupe/actors/detail/split_count.hpp"

namespace troupe::actors::detail {

namespace {

// ASan must see a call used after it was freed; TSan checks the lists themselves.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kPooled = false;
#else
constexpr bool kPooled = true;
#endif

constexpr std::size_t kClasses = kLargestPooledCall / kCallSizeClass;

struct FreeBlock {
  FreeBlock* next;
};

struct SizeClass {
  alignas(kApart) std::atomic<FreeBlock*> shared{nullptr};
  // Blocks on the shared list and every thread's own, give or take what each thread
  // has not yet added in (below): the poster takes blocks and the runner returns them,
  // and a count both wrote on every call moved between their cores each time.
  alignas(kApart) std::atomic<int> kept{0};
};
std::array<SizeClass, kClasses> g_classes;
constexpr int kCountBatch = 32;

// A thread's own free blocks, handed back to malloc when the thread ends (emptied, so
// that a call made later in the thread's teardown takes fresh blocks).
struct OwnLists {
  std::array<FreeBlock*, kClasses> heads{};
  std::array<int, kClasses> uncounted{};  // this thread's change to `kept` not yet added in
  ~OwnLists() {
    for (std::size_t c = 0; c < kClasses; ++c) {
      int freed = 0;
      for (FreeBlock* b = std::exchange(heads[c], nullptr); b != nullptr; ++freed) {
        FreeBlock* next = b->next;
        ::operator delete(b);
        b = next;
      }
      g_classes[c].kept.fetch_add(std::exchange(uncounted[c], 0) - freed, std::memory_order_relaxed);
    }
  }
  void count(std::size_t c, int change) {
    int& mine = uncounted[c];
    mine += change;
    if (mine >= kCountBatch || mine <= -kCountBatch)
      g_classes[c].kept.fetch_add(std::exchange(mine, 0), std::memory_order_relaxed);
  }
};
thread_local OwnLists t_own;

std::size_t class_of(std::size_t bytes) { return (bytes + kCallSizeClass - 1) / kCallSizeClass - 1; }

}  // namespace

void* allocate_call(std::size_t bytes) {
  if (!kPooled || bytes > kLargestPooledCall) return ::operator new(bytes);
  const std::size_t c = class_of(bytes);
  FreeBlock*& own = t_own.heads[c];
  if (own == nullptr) own = g_classes[c].shared.exchange(nullptr, std::memory_order_acquire);
  if (own == nullptr) return ::operator new((c + 1) * kCallSizeClass);
  FreeBlock* block = own;
  own = block->next;
  t_own.count(c, -1);
  return block;
}

void free_call(void* block, std::size_t bytes) noexcept {
  if (!kPooled || bytes > kLargestPooledCall) return ::operator delete(block);
  const std::size_t c = class_of(bytes);
  SizeClass& size_class = g_classes[c];
  // The bound is kept to within kCountBatch blocks a thread.
  if (size_class.kept.load(std::memory_order_relaxed) + t_own.uncounted[c] >= kPooledCallsPerClass)
    return ::operator delete(block);
  t_own.count(c, 1);
  auto* node = static_cast<FreeBlock*>(block);
  node->next = size_class.shared.load(std::memory_order_relaxed);
  while (!size_class.shared.compare_exchange_weak(node->next, node, std::memory_order_release,
                                                  std::memory_order_relaxed)) {
  }
}

}  // namespace troupe::actors::detail
