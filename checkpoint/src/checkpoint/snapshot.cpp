#include "troupe/checkpoint/snapshot.hpp"

#include <cstring>

#include "troupe/tensor/cuda_memory.hpp"

namespace troupe::checkpoint {

Snapshot::Snapshot(std::vector<tensor::Tensor> spare) {
  for (tensor::Tensor& t : spare)
    if (t.defined() && t.storage().use_count() == 1 && t.offset() == 0 && t.nbytes() == t.storage()->nbytes())
      spare_.emplace(t.nbytes(), std::move(t));
}

std::vector<tensor::Tensor> Snapshot::release_buffers() {
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
    if (t.device().is_cpu())
      std::memcpy(copy.raw_data(), t.raw_data(), t.nbytes());
    else
      copy.copy_(t);
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

void Snapshot::replay(Sink& out) const {
  for (const Op& op : ops_) {
    switch (op.kind) {
      case Op::Kind::group: out.ensure_group(op.path); break;
      case Op::Kind::attribute: out.set_attribute(op.path, op.name, op.value); break;
      case Op::Kind::tensor: out.write_tensor(op.path, op.tensor); break;
    }
  }
}

}  // namespace troupe::checkpoint
