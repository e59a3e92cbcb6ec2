// Buffer: how collectives see a tensor — a pointer, an element count, a dtype and the
// device the memory lives on. It is a view: the caller owns the memory and keeps it
// alive until the collective that uses it has completed (its Work finished).
//
// Collectives never look at shapes; a Tensor converts to a Buffer of all its elements.
#pragma once

#include <cstddef>
#include <cstdint>
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
    return Buffer(bytes() + offset * tensor::element_size(dtype), n, dtype, device);
  }
};

}  // namespace troupe::collectives
