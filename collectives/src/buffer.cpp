#include "troupe/collectives/buffer.hpp"

namespace troupe::collectives {

Buffer::Buffer(const tensor::Tensor& t)
    : Buffer(t.defined() ? t.raw_data() : nullptr, t.defined() ? static_cast<std::size_t>(t.numel()) : 0, t.dtype(),
             t.defined() ? t.device() : Device::cpu()) {
  owner = t.storage();
}

}  // namespace troupe::collectives
