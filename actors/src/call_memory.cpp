#include "troupe/actors/detail/call_memory.hpp"

#include <array>
#include <atomic>
#include <new>
#include <utility>

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
  std::atomic<FreeBlock*> shared{nullptr};
  std::atomic<int> kept{0};  // blocks on the shared list and every thread's own
};
std::array<SizeClass, kClasses> g_classes;

// A thread's own free blocks, handed back to malloc when the thread ends (emptied, so
// that a call made later in the thread's teardown takes fresh blocks).
struct OwnLists {
  std::array<FreeBlock*, kClasses> heads{};
  ~OwnLists() {
    for (std::size_t c = 0; c < kClasses; ++c) {
      int freed = 0;
      for (FreeBlock* b = std::exchange(heads[c], nullptr); b != nullptr; ++freed) {
        FreeBlock* next = b->next;
        ::operator delete(b);
        b = next;
      }
      g_classes[c].kept.fetch_sub(freed, std::memory_order_relaxed);
    }
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
  g_classes[c].kept.fetch_sub(1, std::memory_order_relaxed);
  return block;
}

void free_call(void* block, std::size_t bytes) noexcept {
  if (!kPooled || bytes > kLargestPooledCall) return ::operator delete(block);
  SizeClass& size_class = g_classes[class_of(bytes)];
  if (size_class.kept.fetch_add(1, std::memory_order_relaxed) >= kPooledCallsPerClass) {
    size_class.kept.fetch_sub(1, std::memory_order_relaxed);
    return ::operator delete(block);
  }
  auto* node = static_cast<FreeBlock*>(block);
  node->next = size_class.shared.load(std::memory_order_relaxed);
  while (!size_class.shared.compare_exchange_weak(node->next, node, std::memory_order_release,
                                                  std::memory_order_relaxed)) {
  }
}

}  // namespace troupe::actors::detail
