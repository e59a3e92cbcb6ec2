#include "troupe/train/host_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "troupe/error.hpp"
#include "troupe/tensor/storage.hpp"

namespace troupe::train {

struct HostPool::Counters {
  mutable std::mutex mutex;
  std::size_t bytes = 0, mapped = 0, pinned = 0, peak = 0;
  std::set<const void*> live;
};

HostPool::HostPool() : counters_(std::make_shared<Counters>()) {}

tensor::Tensor HostPool::empty(const tensor::Shape& shape, tensor::DType dtype) {
  const std::size_t nbytes = static_cast<std::size_t>(tensor::shape_numel(shape)) * tensor::element_size(dtype);
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t mapped = std::max<std::size_t>(page, (nbytes + page - 1) / page * page);
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED)
    TROUPE_THROW(Error, "HostPool: mmap of ", mapped, " bytes failed: ", std::strerror(errno));
  // Locking is best effort: RLIMIT_MEMLOCK is often small in containers.
  const bool locked = mlock(data, mapped) == 0;
  {
    std::lock_guard lock(counters_->mutex);
    counters_->bytes += nbytes;
    counters_->mapped += mapped;
    if (locked) counters_->pinned += mapped;
    counters_->peak = std::max(counters_->peak, counters_->bytes);
    counters_->live.insert(data);
  }
  auto storage = tensor::Storage::adopt(
      data, nbytes, tensor::Device::cpu(), [counters = counters_, nbytes, mapped, locked](void* p) {
        {
          std::lock_guard lock(counters->mutex);
          counters->bytes -= nbytes;
          counters->mapped -= mapped;
          if (locked) counters->pinned -= mapped;
          counters->live.erase(p);
        }
        if (locked) munlock(p, mapped);
        munmap(p, mapped);
      });
  return tensor::Tensor::from_storage(std::move(storage), shape, dtype);
}

tensor::Tensor HostPool::zeros(const tensor::Shape& shape, tensor::DType dtype) {
  tensor::Tensor t = empty(shape, dtype);  // fresh anonymous pages are zero already
  return t;
}

std::size_t HostPool::bytes() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->bytes;
}
std::size_t HostPool::mapped_bytes() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->mapped;
}
std::size_t HostPool::pinned_bytes() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->pinned;
}
std::size_t HostPool::peak_bytes() const {
  std::lock_guard lock(counters_->mutex);
  return counters_->peak;
}

bool HostPool::owns(const tensor::Tensor& t) const {
  if (!t.defined()) return false;
  std::lock_guard lock(counters_->mutex);
  return counters_->live.contains(t.storage()->data());
}

}  // namespace troupe::train
