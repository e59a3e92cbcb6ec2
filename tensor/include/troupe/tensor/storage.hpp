// A reference-counted block of bytes on one device. Tensors share a Storage and
// view it at an offset, which is how a gradient bucket or a flat parameter shard
// holds many tensors in one buffer. The last owner frees the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "troupe/tensor/device.hpp"

namespace troupe::tensor {

// What a meta storage's elements are once materialised (meta.hpp): unset until a
// factory or an initialiser describes them; element i of a random fill is
// Philox element i of the draw at (seed, offset), as on the CPU.
struct MetaFill {
  enum class Kind { unset, constant, uniform, normal };
  Kind kind = Kind::unset;
  double a = 0, b = 0;  // constant: the value; uniform: [a, b); normal: mean a, std b
  std::uint64_t seed = 0, offset = 0;
};

class Storage {
 public:
  using Deleter = std::function<void(void*)>;

  // Host memory is 64-byte aligned (a cache line; enough for every vector unit) and
  // not initialised. CUDA memory comes from the device allocator.
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device);
  // On the meta device no memory is allocated: data() is null and nbytes() what the
  // storage would hold.
  // Adopts memory owned elsewhere (a received message, a mapped file); `deleter` runs
  // when the last tensor viewing it goes away. A null deleter means not owned.
  static std::shared_ptr<Storage> adopt(void* data, std::size_t nbytes, Device device, Deleter deleter);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Meta storage only: how its elements are described.
  const MetaFill& meta_fill() const { return meta_fill_; }
  void set_meta_fill(const MetaFill& fill) { meta_fill_ = fill; }

 private:
  Storage(void* data, std::size_t nbytes, Device device, Deleter deleter)
      : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

  void* data_;
  std::size_t nbytes_;
  Device device_;
  Deleter deleter_;
  MetaFill meta_fill_{};
};

}  // namespace troupe::tensor
