// Buffer: how collectives see a tensor — a pointer, an element count, a dtype and the
// device the memory lives on. A Buffer made from a Tensor shares its storage, and an
// async collective holds its buffers until it completes, so a tensor dropped while
// its collective runs stays valid (as PyTorch's Work keeps its tensors). A Buffer of
// a raw pointer, vector or span is a plain view: its owner keeps the memory alive
// until the Work completes.
//
// Collectives never look at shapes; a Tensor converts to a Buffer of all its elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::collectives {

using tensor::Device;
using tensor::DType;

struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  DType dtype = DType::f32;
  Device device = Device::cpu();
  std::shared_ptr<const void> owner;  // a tensor's storage; null for a plain view

  Buffer() = default;
  Buffer(void* data, std::size_t count, DType dtype, Device device = Device::cpu())
      : data(data), count(count), dtype(dtype), device(device) {}
  // Host memory of a C++ element type that has a troupe dtype (float, Half, int64_t, ...).
  template <class T>
  Buffer(T* data, std::size_t count) : Buffer(data, count, tensor::dtype_of<T>) {}
  template <class T>
  Buffer(std::vector<T>& values) : Buffer(values.data(), values.size()) {}  // NOLINT: implicit view
  template <class T>
  Buffer(std::span<T> values) : Buffer(values.data(), values.size()) {}  // NOLINT: implicit view
  // All elements of a (contiguous) tensor, on its device.
  Buffer(const tensor::Tensor& t);  // NOLINT: implicit view

  std::size_t nbytes() const { return count * tensor::element_size(dtype); }
  std::byte* bytes() const { return static_cast<std::byte*>(data); }
  // Elements [offset, offset + n) of this buffer.
  Buffer slice(std::size_t offset, std::size_t n) const {
    Buffer part(bytes() + offset * tensor::element_size(dtype), n, dtype, device);
    part.owner = owner;
    return part;
  }
};

}  // namespace troupe::collectives
