// A reference-counted block of bytes on one device. Tensors share a Storage and
// view it at an offset, which is how a gradient bucket or a flat parameter shard
// holds many tensors in one buffer. The last owner frees the bytes.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "troupe/tensor/device.hpp"

namespace troupe::tensor {

class Storage {
 public:
  using Deleter = std::function<void(void*)>;

  // Host memory is 64-byte aligned (a cache line; enough for every vector unit) and
  // not initialised. CUDA memory comes from the device allocator.
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Device device);
  // Adopts memory owned elsewhere (a received message, a mapped file); `deleter` runs
  // when the last tensor viewing it goes away. A null deleter means not owned.
  static std::shared_ptr<Storage> adopt(void* data, std::size_t nbytes, Device device,
                                        Deleter deleter);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Storage(void* data, std::size_t nbytes, Device device, Deleter deleter)
      : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

  void* data_;
  std::size_t nbytes_;
  Device device_;
  Deleter deleter_;
};

}  // namespace troupe::tensor
