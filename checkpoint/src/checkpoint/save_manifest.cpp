#include "troupe/checkpoint/save_manifest.hpp"

#include "troupe/error.hpp"

namespace troupe::checkpoint {

std::int64_t SaveManifest::add_tensor(std::string path, tensor::DType dtype, const tensor::Shape& shape) {
  tensors.push_back({std::move(path), std::string(tensor::dtype_name(dtype)), shape});
  return static_cast<std::int64_t>(tensors.size()) - 1;
}

}  // namespace troupe::checkpoint
