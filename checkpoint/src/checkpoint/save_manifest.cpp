#include "troupe/checkpoint/save_manifest.hpp"

#include <algorithm>

#include "troupe/error.hpp"

namespace troupe::checkpoint {

std::int64_t SaveManifest::add_tensor(std::string path, tensor::DType dtype, const tensor::Shape& shape) {
  tensors.push_back({std::move(path), std::string(tensor::dtype_name(dtype)), shape});
  return static_cast<std::int64_t>(tensors.size()) - 1;
}

std::pair<std::int64_t, std::int64_t> shard_range(std::int64_t numel, int rank, int world) {
  TROUPE_CHECK(world > 0 && rank >= 0 && rank < world, "shard_range: rank ", rank, " of world ", world);
  std::int64_t base = numel / world, extra = numel % world;
  std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

}  // namespace troupe::checkpoint
