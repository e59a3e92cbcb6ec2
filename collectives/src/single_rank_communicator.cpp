#include "troupe/collectives/single_rank_communicator.hpp"

#include <cstring>

#include "troupe/error.hpp"

namespace troupe::collectives {

SingleRankCommunicator::SingleRankCommunicator(Options options) : Communicator(0, 1, options) {}

std::unique_ptr<Communicator> SingleRankCommunicator::split(int color, int /*key*/) {
  if (color < 0) return nullptr;
  return std::make_unique<SingleRankCommunicator>(options());
}

Work SingleRankCommunicator::start(const Collective& c, bool /*blocking*/) {
  TROUPE_CHECK(!c.is_point_to_point(), c.describe(), ": a single-rank communicator has no peer to talk to");
  for (const Buffer* b : {&c.input, &c.output}) {
    TROUPE_CHECK(b->count == 0 || b->device.is_cpu(), c.describe(), ": the single-rank backend copies host memory, ",
                 "but a buffer is on ", b->device, "; use the NCCL backend for CUDA buffers");
  }
  // Every collective over one rank leaves the input where the output is; memmove since
  // an in-place call may pass overlapping (identical) buffers.
  if (c.kind != CollectiveKind::barrier && !c.in_place && c.output.data && c.input.data) {
    const std::size_t bytes = c.count * tensor::element_size(c.dtype);
    if (bytes) std::memmove(c.output.data, c.input.data, bytes);
  }
  return Work();
}

}  // namespace troupe::collectives
