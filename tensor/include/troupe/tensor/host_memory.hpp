// Bytes of host memory that Storage::allocate holds right now, and at most since the
// last reset_host_memory_peak() -- what torch.cuda.memory_allocated() and
// max_memory_allocated() say for a GPU, for the host -- so that a test or benchmark
// can check the ZeRO/FSDP memory formulas against what was really allocated. Memory
// given to Storage::adopt is not counted: its owner allocated it.
#pragma once

#include <cstddef>

namespace troupe::tensor {

struct HostMemoryStats {
  std::size_t live_bytes = 0;
  std::size_t peak_bytes = 0;
};

HostMemoryStats host_memory_stats();
// Starts a new peak at the current live bytes.
void reset_host_memory_peak();

}  // namespace troupe::tensor
