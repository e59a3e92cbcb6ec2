// Memory for calls (call.hpp). A call is allocated by the thread that posts it and
// freed by the thread that ran it. Under glibc's malloc that pair contends for the
// poster's arena lock on every call: futex waits and malloc were 40% of a local
// tell's time. Calls of up to kLargestPooledCall bytes are therefore recycled: a freed
// block goes onto its size class's shared list (one compare-and-swap), and a thread
// whose own list of free blocks runs dry takes the whole shared list at once (one
// exchange) -- no lock, and no ABA problem, since nothing is ever popped from the
// shared list alone. At most kPooledCallsPerClass blocks a class are kept (give or
// take a small batch a thread); the rest go back to malloc. Under ASan calls use
// plain new and delete, so that a call used after it was freed is still caught.
#pragma once

#include <cstddef>

namespace troupe::actors::detail {

inline constexpr std::size_t kCallSizeClass = 64;
inline constexpr std::size_t kLargestPooledCall = 512;
inline constexpr int kPooledCallsPerClass = 4096;

// A block of at least `bytes` bytes, aligned for any fundamental type.
void* allocate_call(std::size_t bytes);
// Returns a block from allocate_call(bytes), with the same `bytes`.
void free_call(void* block, std::size_t bytes) noexcept;

}  // namespace troupe::actors::detail
