#include "troupe/tensor/storage.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "cuda/cuda_backend.hpp"

namespace troupe::tensor {

namespace {
constexpr std::size_t kHostAlignment = 64;
// Buffers this large come straight from mmap and are unmapped when freed, so every
// fresh tensor pays a page fault per 4 KiB (a 64 MB add ran at 1 GB/s, bound by
// faults). Aligned to a huge page and marked for transparent huge pages (which
// Debian's default "madvise" mode grants only when asked), they fault 512x less.
constexpr std::size_t kHugePage = std::size_t{2} << 20;
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
  const std::size_t alignment = nbytes >= kHugePage ? kHugePage : kHostAlignment;
  const std::size_t rounded = (nbytes + alignment - 1) / alignment * alignment;
  void* data = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  if (data == nullptr) throw std::bad_alloc();
  if (alignment == kHugePage) madvise(data, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
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
