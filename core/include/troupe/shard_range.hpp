// shard_range: how troupe splits a flat tensor over ranks. The sharded optimizers and
// FSDP hold these ranges, and the checkpoint re-slices a saved tensor by them on load,
// so the two modules share this one definition.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "troupe/error.hpp"

namespace troupe {

// The contiguous flat range [begin, end) of a tensor of `numel` elements that `rank` of
// `world` holds when split as evenly as possible, the first numel % world ranks taking
// one more.
inline std::pair<std::int64_t, std::int64_t> shard_range(std::int64_t numel, int rank, int world) {
  TROUPE_CHECK(world > 0 && rank >= 0 && rank < world, "shard_range: rank ", rank, " of world ", world);
  const std::int64_t base = numel / world, extra = numel % world;
  const std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

}  // namespace troupe
