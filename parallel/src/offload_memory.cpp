#include "troupe/parallel/offload_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "troupe/error.hpp"
#include "troupe/tensor/cuda_memory.hpp"
#include "troupe/tensor/storage.hpp"

namespace troupe::parallel {

struct OffloadMemory::Counters {
  // One allocation: its requested and mapped bytes, and whether they are page-locked.
  struct Block {
    const void* data;
    std::size_t nbytes, mapped;
    bool locked;
  };
  void add(const Block& b) {
    std::lock_guard lock(mutex);
    bytes += b.nbytes;
    mapped += b.mapped;
    if (b.locked) pinned += b.mapped;
    peak = std::max(peak, bytes);
    live.insert(b.data);
  }
  void remove(const Block& b) {
    std::lock_guard lock(mutex);
    bytes -= b.nbytes;
    mapped -= b.mapped;
    if (b.locked) pinned -= b.mapped;
    live.erase(b.data);
  }

  mutable std::mutex mutex;
  std::size_t bytes = 0, mapped = 0, pinned = 0, peak = 0;
  std::set<const void*> live;
};

OffloadMemory::OffloadMemory(tensor::Device compute) : counters_(std::make_shared<Counters>()), compute_(compute) {}

tensor::Tensor OffloadMemory::empty(const tensor::Shape& shape, tensor::DType dtype) {
  const std::size_t nbytes = static_cast<std::size_t>(tensor::shape_numel(shape)) * tensor::element_size(dtype);
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t mapped = std::max<std::size_t>(page, (nbytes + page - 1) / page * page);
  std::shared_ptr<tensor::Storage> storage;
  if (compute_.is_cuda()) {
    // The block keeps cudaHostAlloc's memory; the pool's storage lends it out, counted,
    // and the memory goes when the deleter (which holds the block) does.
    tensor::Tensor block = tensor::pinned_empty({static_cast<std::int64_t>(mapped)}, tensor::DType::u8);
    const Counters::Block b{block.raw_data(), nbytes, mapped, tensor::is_pinned(block)};
    counters_->add(b);
    storage = tensor::Storage::adopt(block.raw_data(), nbytes, tensor::Device::cpu(),
                                     [counters = counters_, b, block](void*) { counters->remove(b); });
  } else {
    void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED)
      TROUPE_THROW(Error, "OffloadMemory: mmap of ", mapped, " bytes failed: ", std::strerror(errno));
    // Locking is best effort: RLIMIT_MEMLOCK is often small in containers.
    const Counters::Block b{data, nbytes, mapped, mlock(data, mapped) == 0};
    counters_->add(b);
    storage = tensor::Storage::adopt(data, nbytes, tensor::Device::cpu(), [counters = counters_, b](void* p) {
      counters->remove(b);
      if (b.locked) munlock(p, b.mapped);
      munmap(p, b.mapped);
    });
  }
  return tensor::Tensor::from_storage(std::move(storage), shape, dtype);
}

tensor::Tensor OffloadMemory::zeros(const tensor::Shape& shape, tensor::DType dtype) {
  tensor::Tensor t = empty(shape, dtype);
  if (compute_.is_cuda()) t.zero_();  // fresh anonymous pages are zero already; cudaHostAlloc's are not
  return t;
}

std::size_t OffloadMemory::bytes() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->bytes;
}
std::size_t OffloadMemory::mapped_bytes() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->mapped;
}
std::size_t OffloadMemory::pinned_bytes() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->pinned;
}
std::size_t OffloadMemory::peak_bytes() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->peak;
}

bool OffloadMemory::owns(const tensor::Tensor& t) const {
  if (!t.defined()) return false;
  std::lock_guard lock(counters_->mutex);
  return counters_->live.contains(t.storage()->data());
}

}  // namespace troupe::parallel
