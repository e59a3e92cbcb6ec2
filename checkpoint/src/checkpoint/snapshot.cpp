#include "troupe/checkpoint/snapshot.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>

#include "troupe/tensor/cuda_memory.hpp"

namespace troupe::checkpoint {

namespace {

// Host copies at least this large wait for finish(); smaller ones are made at once.
constexpr std::size_t kBatchedBytes = std::size_t{1} << 20;
constexpr int kMaxCopyThreads = 4;

int copy_threads() {
  cpu_set_t cores;
  CPU_ZERO(&cores);
  if (sched_getaffinity(0, sizeof cores, &cores) != 0) return 1;
  return std::clamp(CPU_COUNT(&cores), 1, kMaxCopyThreads);
}

}  // namespace

void Snapshot::finish() {
  if (pending_.empty()) return;
  std::size_t total = 0;
  for (const PendingCopy& c : pending_) total += c.to.nbytes();
  // Thread i copies bytes [i total / k, (i + 1) total / k) of the copies laid end to end.
  const auto copy_share = [&](int i, int k) {
    const std::size_t begin = total * static_cast<std::size_t>(i) / static_cast<std::size_t>(k);
    const std::size_t end = total * static_cast<std::size_t>(i + 1) / static_cast<std::size_t>(k);
    std::size_t at = 0;
    for (const PendingCopy& c : pending_) {
      const std::size_t n = c.to.nbytes(), lo = std::max(begin, at), hi = std::min(end, at + n);
      if (lo < hi)
        std::memcpy(static_cast<std::byte*>(c.to.raw_data()) + (lo - at),
                    static_cast<const std::byte*>(c.from.raw_data()) + (lo - at), hi - lo);
      at += n;
    }
  };
  static const int threads = copy_threads();
  std::vector<std::thread> helpers;
  for (int i = 1; i < threads; ++i) {
    try {
      helpers.emplace_back(copy_share, i, threads);
    } catch (const std::system_error&) {  // no thread to be had: copy that share here
      copy_share(i, threads);
    }
  }
  copy_share(0, threads);
  for (std::thread& helper : helpers) helper.join();
  pending_.clear();
}

Snapshot::Snapshot(std::vector<tensor::Tensor> spare) {
  for (tensor::Tensor& t : spare)
    if (t.defined() && t.storage().use_count() == 1 && t.offset() == 0 && t.nbytes() == t.storage()->nbytes())
      spare_.emplace(t.nbytes(), std::move(t));
}

std::vector<tensor::Tensor> Snapshot::release_buffers() {
  finish();
  std::vector<tensor::Tensor> out;
  for (Op& op : ops_)
    if (op.kind == Op::Kind::tensor) out.push_back(std::move(op.tensor));
  ops_.clear();
  return out;
}

void Snapshot::ensure_group(std::string_view group) {
  ops_.push_back({Op::Kind::group, std::string(group), {}, {}, {}});
}

void Snapshot::set_attribute(std::string_view group, std::string_view name, const AttrValue& value) {
  ops_.push_back({Op::Kind::attribute, std::string(group), std::string(name), value, {}});
}

void Snapshot::write_tensor(std::string_view path, const tensor::Tensor& t) {
  TROUPE_CHECK(t.defined(), "checkpoint snapshot ", path, ": tensor is undefined");
  tensor::Tensor copy;
  if (t.storage() && scratch_.count(t.storage().get())) {
    copy = t;  // built in our own scratch buffer: nobody else holds it
    scratch_.erase(t.storage().get());
  } else if (auto it = spare_.find(t.nbytes()); it != spare_.end() && t.nbytes() > 0) {
    copy = tensor::Tensor::from_storage(it->second.storage(), t.shape(), t.dtype());
    spare_.erase(it);
    if (t.device().is_cpu() && t.nbytes() >= kBatchedBytes)
      pending_.push_back({copy, t});
    else if (t.device().is_cpu())
      std::memcpy(copy.raw_data(), t.raw_data(), t.nbytes());
    else
      copy.copy_(t);
  } else if (t.device().is_cpu() && t.nbytes() >= kBatchedBytes) {
    copy = tensor::Tensor::empty(t.shape(), t.dtype());
    pending_.push_back({copy, t});
  } else if (t.device().is_cpu()) {
    copy = t.clone();
  } else {
    // Page-locked, so the device copies by DMA rather than through a bounce buffer; a
    // spare for the next snapshot all the same.
    copy = tensor::pinned_empty(t.shape(), t.dtype());
    copy.copy_(t);
  }
  bytes_ += copy.nbytes();
  ops_.push_back({Op::Kind::tensor, std::string(path), {}, {}, std::move(copy)});
}

tensor::Tensor Snapshot::scratch(const tensor::Shape& shape, tensor::DType dtype) {
  tensor::Tensor t = tensor::Tensor::empty(shape, dtype);
  scratch_.insert(t.storage().get());
  return t;
}

void Snapshot::replay(Sink& out) {
  finish();
  for (const Op& op : ops_) {
    switch (op.kind) {
      case Op::Kind::group: out.ensure_group(op.path); break;
      case Op::Kind::attribute: out.set_attribute(op.path, op.name, op.value); break;
      case Op::Kind::tensor: out.write_tensor(op.path, op.tensor); break;
    }
  }
}

}  // namespace troupe::checkpoint
