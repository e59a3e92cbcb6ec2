// Bytes of host memory that Storage::allocate holds right now, and at most since the
// last reset_host_memory_peak() -- what torch.cuda.memory_allocated() and
// max_memory_allocated() say for a GPU, for the host -- so that a test or benchmark
// can check the ZeRO/FSDP memory formulas against what was really allocated. Memory
// given to Storage::adopt is not counted: its owner allocated it.
//
// Freed blocks of 64 KiB to 8 MiB are kept for reuse, up to 256 MiB of them, each for
// at most 2 s unused (a step allocates the same activations every micro-batch; glibc
// handed such blocks back to the kernel and each step paid a page fault per 4 KiB
// again). cached_bytes counts them; empty_host_cache() hands them back. Builds under AddressSanitizer keep none,
// so that a use after free is still caught.
#pragma once

#include <cstddef>

namespace troupe::tensor {

struct HostMemoryStats {
  std::size_t live_bytes = 0;
  std::size_t peak_bytes = 0;
  std::size_t cached_bytes = 0;  // freed, kept for reuse; not in live_bytes
};

HostMemoryStats host_memory_stats();
// Starts a new peak at the current live bytes.
void reset_host_memory_peak();
// Hands every cached block back to the system allocator.
void empty_host_cache();

}  // namespace troupe::tensor
