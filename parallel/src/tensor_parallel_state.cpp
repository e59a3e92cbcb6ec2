// Splitting full tensors into tp parts and gathering them back: tensor_parallel_splits,
// full_state_dict, load_full_state_dict, the tp gradient norm, TensorParallelStateDicts.
#include <cmath>
#include <cstring>
#include <string>

#include "tensor_parallel_detail.hpp"
#include "troupe/error.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/shard_range.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

using collectives::Buffer;
using detail::length;

namespace {

// Rows of a [R, ...] tensor (a 1-D tensor's elements) or columns of a [R, C] one.
struct Layout {
  std::int64_t rows = 0, cols = 0;  // cols: elements per row
};

Layout layout_of(const tensor::Shape& shape) {
  Layout l{shape.empty() ? 1 : shape[0], 1};
  for (std::size_t d = 1; d < shape.size(); ++d) l.cols *= shape[d];
  return l;
}

tensor::Shape piece_shape(const TensorSplit& s, int rank, int world) {
  tensor::Shape shape = s.full_shape;
  const std::size_t d = s.dim == TensorSplit::Dim::rows ? 0 : 1;
  TROUPE_CHECK(shape.size() > d, "tensor parallelism: a ", tensor::to_string(shape), " tensor has no dimension ", d,
               " to split");
  shape[d] = s.dim == TensorSplit::Dim::rows ? s.groups * length(shape[d] / s.groups, rank, world)
                                             : length(shape[d], rank, world);
  return shape;
}

// Copies between a full tensor and rank's piece, in either direction (to_piece: full -> piece).
void copy_piece(const TensorSplit& s, int rank, int world, const std::byte* from, std::byte* to, std::size_t element,
                bool to_piece) {
  const Layout full = layout_of(s.full_shape);
  if (s.dim == TensorSplit::Dim::rows) {
    const std::int64_t per_group = full.rows / s.groups;
    const auto [begin, end] = shard_range(per_group, rank, world);
    const std::size_t row_bytes = static_cast<std::size_t>(full.cols) * element;
    std::int64_t out_row = 0;
    for (std::int64_t g = 0; g < s.groups; ++g)
      for (std::int64_t r = g * per_group + begin; r < g * per_group + end; ++r, ++out_row) {
        const std::size_t f = static_cast<std::size_t>(r) * row_bytes,
                          p = static_cast<std::size_t>(out_row) * row_bytes;
        if (to_piece)
          std::memcpy(to + p, from + f, row_bytes);
        else
          std::memcpy(to + f, from + p, row_bytes);
      }
    return;
  }
  const auto [begin, end] = shard_range(full.cols, rank, world);
  const std::size_t bytes = static_cast<std::size_t>(end - begin) * element;
  for (std::int64_t r = 0; r < full.rows; ++r) {
    const std::size_t f = (static_cast<std::size_t>(r * full.cols + begin)) * element;
    const std::size_t p = static_cast<std::size_t>(r) * bytes;
    if (to_piece)
      std::memcpy(to + p, from + f, bytes);
    else
      std::memcpy(to + f, from + p, bytes);
  }
}

// On the host: a device tensor is copied there first (state dicts travel and load from
// the host).
Tensor piece_of(const Tensor& on_device, const TensorSplit& s, int rank, int world) {
  const Tensor full = on_device.to(tensor::Device::cpu());
  Tensor piece = Tensor::empty(piece_shape(s, rank, world), full.dtype());
  copy_piece(s, rank, world, static_cast<const std::byte*>(full.raw_data()), static_cast<std::byte*>(piece.raw_data()),
             tensor::element_size(full.dtype()), true);
  return piece;
}

Tensor gather_pieces(const Tensor& on_device, const TensorSplit& s, collectives::Communicator& tp) {
  const Tensor piece = on_device.to(tensor::Device::cpu());
  const int world = tp.size();
  const std::int64_t slot = tensor::shape_numel(piece_shape(s, 0, world));  // rank 0's piece is the largest
  const std::size_t element = tensor::element_size(piece.dtype());
  Tensor mine = Tensor::zeros({slot}, piece.dtype());
  std::memcpy(mine.raw_data(), piece.raw_data(), piece.nbytes());
  Tensor all = Tensor::empty({slot * world}, piece.dtype());
  tp.allgather(Buffer(mine), Buffer(all));
  Tensor full = Tensor::empty(s.full_shape, piece.dtype());
  for (int r = 0; r < world; ++r)
    copy_piece(s, r, world,
               static_cast<const std::byte*>(all.raw_data()) + static_cast<std::size_t>(r * slot) * element,
               static_cast<std::byte*>(full.raw_data()), element, false);
  return full;
}

void collect_splits(nn::Module& module, const std::string& prefix, std::map<std::string, TensorSplit>& out) {
  if (auto* column = dynamic_cast<ColumnParallelLinear*>(&module)) {
    TensorSplit s = column->split();
    s.full_shape = {column->full_out_features(), column->in_features()};
    out[prefix + "weight"] = s;
    if (column->bias()) out[prefix + "bias"] = {s.dim, s.groups, {column->full_out_features()}};
  } else if (auto* row = dynamic_cast<RowParallelLinear*>(&module)) {
    out[prefix + "weight"] = {TensorSplit::Dim::columns, 1, {row->out_features(), row->full_in_features()}};
  } else if (auto* table = dynamic_cast<VocabParallelEmbedding*>(&module)) {
    out[prefix + "weight"] = {TensorSplit::Dim::rows, 1, {table->full_vocab(), table->embedding_dim()}};
  }
  for (const auto& child : module.named_children()) collect_splits(*child.module, prefix + child.name + ".", out);
}

}  // namespace

std::map<std::string, TensorSplit> tensor_parallel_splits(nn::Module& model) {
  std::map<std::string, TensorSplit> out;
  collect_splits(model, "", out);
  return out;
}

nn::StateDict full_model_state_dict(const nn::StateDict& parts, const std::map<std::string, TensorSplit>& splits,
                                    collectives::Communicator& tp) {
  nn::StateDict full;
  for (const auto& [name, value] : parts) {
    const auto split = splits.find(name);
    full.insert(name, split == splits.end() ? value.clone() : gather_pieces(value, split->second, tp));
  }
  return full;
}

nn::StateDict model_state_dict_part(const nn::StateDict& full, const std::map<std::string, TensorSplit>& splits,
                                    const collectives::Communicator& tp) {
  nn::StateDict parts;
  for (const auto& [name, whole] : full) {
    const auto split = splits.find(name);
    if (split == splits.end()) {
      parts.insert(name, whole);
      continue;
    }
    TROUPE_CHECK(whole.shape() == split->second.full_shape, "load_full_state_dict: '", name, "' is ",
                 tensor::to_string(whole.shape()), ", the model's full shape is ",
                 tensor::to_string(split->second.full_shape));
    parts.insert(name, piece_of(whole, split->second, tp.rank(), tp.size()));
  }
  return parts;
}

nn::StateDict full_state_dict(nn::Module& model, collectives::Communicator& tp) {
  return full_model_state_dict(model.state_dict(), tensor_parallel_splits(model), tp);
}

void load_full_state_dict(nn::Module& model, const nn::StateDict& full, collectives::Communicator& tp) {
  const nn::StateDict mine = model.state_dict();
  for (const auto& [name, value] : full)
    if (!mine.contains(name))
      TROUPE_THROW(InvalidArgument, "load_full_state_dict: unexpected key '", name, "' for this model");
  nn::StateDict wanted;
  for (const auto& [name, value] : mine) wanted.insert(name, full.at(name));
  model.load_state_dict(model_state_dict_part(wanted, tensor_parallel_splits(model), tp));
}

double tensor_parallel_grad_norm(nn::Module& model, collectives::Communicator& tp) {
  const auto splits = tensor_parallel_splits(model);
  double split_squares = 0, whole_squares = 0;
  for (const auto& [name, param] : model.named_parameters()) {
    if (!param->grad.defined()) continue;
    (splits.count(name) ? split_squares : whole_squares) += detail::sum_of_squares(param->grad);
  }
  tp.allreduce(Buffer(&split_squares, 1));
  return std::sqrt(split_squares + whole_squares);
}

double tensor_parallel_clip_grad_norm(nn::Module& model, double max_norm, collectives::Communicator& tp) {
  const double total = tensor_parallel_grad_norm(model, tp);
  const double factor = max_norm / (total + 1e-6);  // torch's clip_grad_norm_
  if (!std::isfinite(total) || factor >= 1.0) return total;
  for (nn::Parameter* p : model.parameters())
    if (p->grad.defined()) tensor::scale_(p->grad, factor);
  return total;
}

// ------------------------------------------------------------ checkpoints

namespace {

// The split of optimizer entry `key` ("<param>/<slot>") when its tensor is split like its
// parameter: `part` says whether `t` is this rank's part (else a full tensor).
const TensorSplit* slot_split(const std::map<std::string, TensorSplit>& splits, const std::string& key, const Tensor& t,
                              bool part, const collectives::Communicator& tp) {
  const auto cut = key.rfind('/');
  if (cut == std::string::npos || t.dim() == 0) return nullptr;
  const auto split = splits.find(key.substr(0, cut));
  if (split == splits.end()) return nullptr;
  const tensor::Shape want = part ? piece_shape(split->second, tp.rank(), tp.size()) : split->second.full_shape;
  return t.shape() == want ? &split->second : nullptr;
}

}  // namespace

TensorParallelStateDicts::TensorParallelStateDicts(nn::Module& model, nn::Optimizer& optimizer,
                                                   DistributedDataParallel& ddp, collectives::Communicator& tp)
    : model_(model), optimizer_(optimizer), ddp_(ddp), tp_(tp), splits_(tensor_parallel_splits(model)) {}

nn::StateDict TensorParallelStateDicts::model_state_dict() { return full_state_dict(model_, tp_); }

nn::StateDict full_optimizer_state_dict(const nn::StateDict& parts, const std::map<std::string, TensorSplit>& splits,
                                        collectives::Communicator& tp) {
  nn::StateDict full;
  for (const auto& [key, value] : parts) {
    const TensorSplit* split = slot_split(splits, key, value, true, tp);
    full.insert(key, split ? gather_pieces(value, *split, tp) : value.clone());
  }
  return full;
}

nn::StateDict optimizer_state_dict_part(const nn::StateDict& full, const std::map<std::string, TensorSplit>& splits,
                                        const collectives::Communicator& tp) {
  nn::StateDict parts;
  for (const auto& [key, value] : full) {
    const TensorSplit* split = slot_split(splits, key, value, false, tp);
    parts.insert(key, split ? piece_of(value, *split, tp.rank(), tp.size()) : value);
  }
  return parts;
}

nn::StateDict TensorParallelStateDicts::optimizer_state_dict() {
  return full_optimizer_state_dict(optimizer_.state_dict(), splits_, tp_);
}

void TensorParallelStateDicts::load_model_state_dict(const nn::StateDict& dict) {
  load_full_state_dict(model_, dict, tp_);
}

void TensorParallelStateDicts::load_optimizer_state_dict(const nn::StateDict& dict) {
  optimizer_.load_state_dict(optimizer_state_dict_part(dict, splits_, tp_));
}

std::int64_t TensorParallelStateDicts::micro_step() const { return ddp_.micro_step(); }
void TensorParallelStateDicts::set_micro_step(std::int64_t step) { ddp_.set_micro_step(step); }

}  // namespace troupe::parallel
