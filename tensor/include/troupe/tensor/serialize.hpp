// cereal serialization of a Tensor: dtype name, shape, then the raw element bytes.
// Works with cereal's binary archives (the ones actor messages use). A CUDA tensor
// is copied to the host to be written; a loaded tensor is on the CPU. Loading checks
// that the dtype is known and that the byte count matches the shape, so a truncated
// or forged message fails with FormatError instead of reading past its end.
#pragma once

#include <cereal/cereal.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <string>

#include "troupe/tensor/tensor.hpp"

namespace troupe::tensor {

template <class Archive>
void save(Archive& archive, const Tensor& t) {
  const bool defined = t.defined();
  archive(defined);
  if (!defined) return;
  const Tensor host = t.to(Device::cpu());
  archive(std::string(dtype_name(host.dtype())), host.shape());
  archive(cereal::make_size_tag(static_cast<cereal::size_type>(host.nbytes())));
  archive(cereal::binary_data(host.raw_data(), host.nbytes()));
}

template <class Archive>
void load(Archive& archive, Tensor& t) {
  std::uint8_t defined = 0;  // written as a bool; read as a byte, since any byte may arrive
  archive(defined);
  if (defined > 1) TROUPE_THROW(FormatError, "tensor deserialization: a defined flag of ", int{defined});
  if (defined == 0) {
    t = Tensor();
    return;
  }
  std::string dtype;
  Shape shape;
  cereal::size_type nbytes = 0;
  archive(dtype, shape);
  archive(cereal::make_size_tag(nbytes));
  DType type;
  try {
    type = dtype_from_name(dtype);
  } catch (const InvalidArgument& e) {
    TROUPE_THROW(FormatError, "tensor deserialization: ", e.what());
  }
  std::int64_t numel = 1;
  for (auto d : shape) {
    if (d < 0 || (d > 0 && numel > (std::int64_t{1} << 48) / d))
      TROUPE_THROW(FormatError, "tensor deserialization: implausible shape ", to_string(shape));
    numel *= d;
  }
  const auto expected = static_cast<std::uint64_t>(numel) * element_size(type);
  if (nbytes != expected)
    TROUPE_THROW(FormatError, "tensor deserialization: ", dtype, " ", to_string(shape), " needs ", expected,
                 " bytes, the message carries ", nbytes);
  t = Tensor::empty(shape, type);
  archive(cereal::binary_data(t.raw_data(), t.nbytes()));
}

}  // namespace troupe::tensor
