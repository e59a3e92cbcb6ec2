// Sink: where a section's tensors and attributes go. FileWriter streams them into an
// HDF5 file; Snapshot keeps host copies to be written later (an asynchronous save).
// SectionWriter talks to this interface, so a state source is written the same way
// whichever of the two receives it.
#pragma once

#include <string_view>

#include "troupe/checkpoint/attribute.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::checkpoint {

class Sink {
 public:
  virtual ~Sink() = default;
  // Absolute HDF5 paths: "/model", "/model/layers.0.weight".
  virtual void ensure_group(std::string_view group) = 0;
  virtual void set_attribute(std::string_view group, std::string_view name, const AttrValue& value) = 0;
  virtual void write_tensor(std::string_view path, const tensor::Tensor& t) = 0;
  // A host tensor to fill and pass to write_tensor (see FileWriter::scratch).
  virtual tensor::Tensor scratch(const tensor::Shape& shape, tensor::DType dtype) = 0;
};

}  // namespace troupe::checkpoint
