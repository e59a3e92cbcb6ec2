#include "troupe/tensor/storage.hpp"

#include <cstdlib>
#include <new>

#include "cuda/cuda_backend.hpp"

namespace troupe::tensor {

namespace {
constexpr std::size_t kHostAlignment = 64;
}

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Device device) {
  check_device_usable(device, "allocate");
  if (device.is_cuda()) {
    const int index = device.index;
    void* data = cuda_backend::allocate(nbytes, index);
    return std::shared_ptr<Storage>(
        new Storage(data, nbytes, device, [index](void* p) { cuda_backend::release(p, index); }));
  }
  // aligned_alloc wants a multiple of the alignment, and a non-zero size so that every
  // storage has a distinct address.
  const std::size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* data = std::aligned_alloc(kHostAlignment, rounded == 0 ? kHostAlignment : rounded);
  if (data == nullptr) throw std::bad_alloc();
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, [](void* p) { std::free(p); }));
}

std::shared_ptr<Storage> Storage::adopt(void* data, std::size_t nbytes, Device device,
                                        Deleter deleter) {
  return std::shared_ptr<Storage>(new Storage(data, nbytes, device, std::move(deleter)));
}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

}  // namespace troupe::tensor
