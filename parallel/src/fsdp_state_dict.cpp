// FSDP's full (unsharded) state dicts: the model's and the optimizer's, under the
// unwrapped model's names, gathered one tensor at a time and loaded from any world size.
//
// A parameter occupies [offset, offset + numel) of its unit's flat buffer, which rank r
// holds in [r*S, (r+1)*S). Gathering it is one broadcast per rank whose block overlaps
// that range (the owner copies its piece in, then broadcasts it), so a tensor never
// costs more traffic than its own size and no rank materialises more than one tensor.
#include <algorithm>
#include <sstream>

#include "troupe/error.hpp"
#include "troupe/parallel/fsdp.hpp"
#include "troupe/parallel/state_slices.hpp"

namespace troupe::parallel {

namespace {
std::string describe(const Tensor& t) {
  return std::string(tensor::dtype_name(t.dtype())) + " " + tensor::to_string(t.shape());
}
}  // namespace

// `local` is this rank's block of something laid out like `flat` (the shard itself, or
// an optimizer slot of it); returns elements [offset, offset + numel) of the whole.
Tensor FullyShardedDataParallel::gather_range(const Flat& flat, const Tensor& local, std::int64_t offset,
                                              std::int64_t numel) {
  Tensor out = Tensor::empty({numel}, local.dtype(), local.device());
  const std::int64_t s = flat.shard_numel;
  for (int r = 0; r < comm_.size(); ++r) {
    const std::int64_t lo = std::max(offset, r * s), hi = std::min(offset + numel, (r + 1) * s);
    if (lo >= hi) continue;
    Tensor piece = out.slice(lo - offset, hi - offset);
    if (r == comm_.rank()) piece.copy_(local.slice(lo - r * s, hi - r * s));
    if (comm_.size() > 1) comm_.broadcast(collectives::Buffer(piece), r);
  }
  return out;
}

std::pair<tensor::Shape, tensor::DType> FullyShardedDataParallel::full_tensor_type(const std::string& key) const {
  if (const auto it = buffers_.find(key); it != buffers_.end()) return {it->second->shape(), it->second->dtype()};
  const auto [u, f] = flat_of_.at(key);
  const Flat& flat = units_[u].flats[f];
  return {flat.entries[entry_of_.at(key)].shape, flat.dtype};
}

// Every rank learns whether any rank failed, so all throw together or none does.
void FullyShardedDataParallel::agree_or_throw(const std::string& local_error, const char* op) {
  std::int32_t failed = local_error.empty() ? -1 : comm_.rank();
  if (comm_.size() > 1) comm_.allreduce(collectives::Buffer(&failed, 1), collectives::ReduceOp::max);
  if (!local_error.empty()) TROUPE_THROW(InvalidArgument, op, ": ", local_error);
  if (failed >= 0) TROUPE_THROW(InvalidArgument, op, ": rank ", failed, " rejected the dict (see its error)");
}

std::vector<FullyShardedDataParallel::LocalSlice> FullyShardedDataParallel::local_model_slices() {
  std::vector<LocalSlice> out;
  const std::int64_t me = comm_.rank();
  for (const auto& key : state_keys_) {
    if (const auto it = buffers_.find(key); it != buffers_.end()) {
      const Tensor& b = *it->second;
      out.push_back({key, b.dtype(), b.shape(), 0, me == 0 ? b.flatten() : Tensor()});
      continue;
    }
    const auto [u, f] = flat_of_.at(key);
    const Flat& flat = units_[u].flats[f];
    const Entry& entry = flat.entries[entry_of_.at(key)];
    LocalSlice slice{key, flat.dtype, entry.shape, 0, Tensor()};
    const std::int64_t lo = std::max(me * flat.shard_numel, entry.offset);
    const std::int64_t hi = std::min((me + 1) * flat.shard_numel, entry.offset + entry.numel);
    if (lo < hi) {
      slice.begin = lo - entry.offset;
      slice.data = flat.shard->data.slice(lo - me * flat.shard_numel, hi - me * flat.shard_numel);
      if (slice.data.dtype() != flat.dtype) slice.data = slice.data.to(flat.dtype);
    }
    out.push_back(std::move(slice));
  }
  return out;
}

std::vector<FullyShardedDataParallel::LocalSlice> FullyShardedDataParallel::local_optimizer_slices() {
  const nn::StateDict shard = optimizer_->state_dict();  // this rank's 1/W
  std::vector<LocalSlice> out;
  const std::int64_t me = comm_.rank();
  for (const auto& key : state_keys_) {
    if (buffers_.contains(key) || aliases_.contains(key)) continue;
    const auto [u, f] = flat_of_.at(key);
    const Flat& flat = units_[u].flats[f];
    const Entry& entry = flat.entries[entry_of_.at(key)];
    const std::string prefix = flat.name + "/";
    for (const auto& [slot_key, value] : shard) {
      if (slot_key.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string name = key + "/" + slot_key.substr(prefix.size());
      if (value.dim() == 0) {
        out.push_back({name, value.dtype(), {}, 0, me == 0 ? value.reshape({1}) : Tensor()});
        continue;
      }
      LocalSlice slice{name, value.dtype(), entry.shape, 0, Tensor()};
      const std::int64_t lo = std::max(me * flat.shard_numel, entry.offset);
      const std::int64_t hi = std::min((me + 1) * flat.shard_numel, entry.offset + entry.numel);
      if (lo < hi) {
        slice.begin = lo - entry.offset;
        slice.data = value.slice(lo - me * flat.shard_numel, hi - me * flat.shard_numel);
      }
      out.push_back(std::move(slice));
    }
  }
  return out;
}

void FullyShardedDataParallel::for_each_full_tensor(
    const std::function<void(const std::string& name, const Tensor& value)>& fn) {
  TROUPE_CHECK(!busy_, "FullyShardedDataParallel::for_each_full_tensor: called inside a forward or backward");
  for (const auto& key : state_keys_) {
    if (const auto it = buffers_.find(key); it != buffers_.end()) {
      fn(key, *it->second);
      continue;
    }
    const auto [u, f] = flat_of_.at(key);
    const Flat& flat = units_[u].flats[f];
    const Entry& entry = flat.entries[entry_of_.at(key)];
    Tensor value = gather_range(flat, flat.shard->data, entry.offset, entry.numel).reshape(entry.shape);
    fn(key, value.dtype() == flat.dtype ? value : value.to(flat.dtype));  // master shards: the model's dtype
  }
}

nn::StateDict FullyShardedDataParallel::full_state_dict() {
  nn::StateDict out;
  for_each_full_tensor([&](const std::string& name, const Tensor& value) { out.insert(name, value); });
  return out;
}

void FullyShardedDataParallel::load_full_state_dict(const nn::StateDict& dict) {
  const char* op = "FullyShardedDataParallel::load_full_state_dict";
  TROUPE_CHECK(!busy_, op, ": called inside a forward or backward");
  std::ostringstream why;
  for (const auto& key : state_keys_) {
    const Tensor* source = dict.find(key);
    const auto [shape, dtype] = full_tensor_type(key);
    if (source == nullptr || !source->defined())
      why << "missing '" << key << "'; ";
    else if (source->shape() != shape || source->dtype() != dtype)
      why << "'" << key << "' is " << tensor::dtype_name(dtype) << " " << tensor::to_string(shape)
          << " in the model but " << describe(*source) << " in the dict; ";
  }
  for (const auto& [key, value] : dict)
    if (std::find(state_keys_.begin(), state_keys_.end(), key) == state_keys_.end())
      why << "unexpected '" << key << "'; ";
  agree_or_throw(why.str(), op);

  const std::int64_t me = comm_.rank();
  for (const auto& key : state_keys_) {
    const Tensor& source = dict.at(key);
    if (const auto it = buffers_.find(key); it != buffers_.end()) {
      it->second->copy_(source);
      continue;
    }
    const auto [u, f] = flat_of_.at(key);
    Flat& flat = units_[u].flats[f];
    const Entry& entry = flat.entries[entry_of_.at(key)];
    const std::int64_t lo = std::max(me * flat.shard_numel, entry.offset);
    const std::int64_t hi = std::min((me + 1) * flat.shard_numel, entry.offset + entry.numel);
    if (lo < hi)
      flat.shard->data.slice(lo - me * flat.shard_numel, hi - me * flat.shard_numel)
          .copy_(source.flatten().slice(lo - entry.offset, hi - entry.offset));
  }
  mark_parameters_stale();  // shard_grad_op: the next forward gathers the loaded shards
}

// The shard optimizer's dict holds "<flat name>/<slot>" blocks; each becomes
// "<param>/<slot>" for every parameter of the flat, in named order (a 0-dim slot, Adam's
// per-parameter step, is the same for every parameter of the flat and is copied).
nn::StateDict FullyShardedDataParallel::full_optimizer_state_dict() {
  TROUPE_CHECK(!busy_, "FullyShardedDataParallel::full_optimizer_state_dict: called inside a forward or backward");
  const nn::StateDict shard = optimizer_->state_dict();
  nn::StateDict out;
  for (const auto& [key, value] : shard)
    if (key.find('/') == std::string::npos) out.insert(key, value);
  std::vector<std::pair<std::string, std::pair<std::size_t, std::size_t>>> params;  // named order
  for (const auto& key : state_keys_)
    if (!buffers_.contains(key) && !aliases_.contains(key)) params.push_back({key, flat_of_.at(key)});
  for (const auto& [name, where] : params) {
    const Flat& flat = units_[where.first].flats[where.second];
    const Entry& entry = flat.entries[entry_of_.at(name)];
    const std::string prefix = flat.name + "/";
    for (const auto& [key, value] : shard) {
      if (key.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string slot = key.substr(prefix.size());
      if (value.dim() == 0)
        out.insert(name + "/" + slot, value.clone());
      else
        out.insert(name + "/" + slot, gather_range(flat, value, entry.offset, entry.numel).reshape(entry.shape));
    }
  }
  return out;
}

void FullyShardedDataParallel::load_full_optimizer_state_dict(const nn::StateDict& dict) {
  const char* op = "FullyShardedDataParallel::load_full_optimizer_state_dict";
  TROUPE_CHECK(!busy_, op, ": called inside a forward or backward");
  const std::int64_t me = comm_.rank();
  nn::StateDict shard;
  std::ostringstream why;
  for (const auto& [key, value] : dict) {
    const std::size_t slash = key.find('/');
    if (slash == std::string::npos) {
      shard.insert(key, value);
    } else if (!flat_of_.contains(key.substr(0, slash))) {
      why << "unknown parameter in '" << key << "'; ";
    }
  }
  for (auto& unit : units_)
    for (auto& flat : unit.flats) {
      // The slots are those of the flat's first parameter; every parameter must have them.
      const std::string first = flat.entries.front().name + "/";
      for (const auto& [key, value] : dict) {
        if (key.compare(0, first.size(), first) != 0) continue;
        const std::string slot = key.substr(first.size());
        if (value.dim() == 0) {
          shard.insert(flat.name + "/" + slot, value.clone());
          continue;
        }
        Tensor block = Tensor::zeros({flat.shard_numel}, value.dtype(), flat.device);
        for (const auto& entry : flat.entries) {
          const Tensor* source = dict.find(entry.name + "/" + slot);
          if (source == nullptr || source->shape() != entry.shape || source->dtype() != value.dtype()) {
            why << "'" << entry.name << "/" << slot << "' is "
                << (source == nullptr ? std::string("missing") : describe(*source)) << ", expected "
                << tensor::dtype_name(value.dtype()) << " " << tensor::to_string(entry.shape) << "; ";
            continue;
          }
          const std::int64_t lo = std::max(me * flat.shard_numel, entry.offset);
          const std::int64_t hi = std::min((me + 1) * flat.shard_numel, entry.offset + entry.numel);
          if (lo < hi)
            block.slice(lo - me * flat.shard_numel, hi - me * flat.shard_numel)
                .copy_(source->flatten().slice(lo - entry.offset, hi - entry.offset));
        }
        shard.insert(flat.name + "/" + slot, block);
      }
    }
  // The optimizer's own checks (hyper-parameters, slot types) run before the ranks
  // agree; a rank whose load succeeded keeps it even when another rank's failed.
  std::string error = why.str();
  if (error.empty()) {
    try {
      optimizer_->load_state_dict(shard);
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
  }
  agree_or_throw(error, op);
}

void FullyShardedDataParallel::load_local_slices(const StateSliceSource& model, const StateSliceSource& optimizer) {
  const char* op = "FullyShardedDataParallel::load_local_slices";
  TROUPE_CHECK(!busy_, op, ": called inside a forward or backward");
  const std::int64_t me = comm_.rank();
  const auto range = [&](const Flat& flat, const Entry& entry) {
    return std::pair{std::max(me * flat.shard_numel, entry.offset),
                     std::min((me + 1) * flat.shard_numel, entry.offset + entry.numel)};
  };
  std::ostringstream why;
  for (const auto& key : state_keys_) {
    const auto [shape, dtype] = full_tensor_type(key);
    if (!model.contains(key))
      why << "missing '" << key << "'; ";
    else if (model.shape(key) != shape || model.dtype(key) != dtype)
      why << "'" << key << "' is " << tensor::dtype_name(dtype) << " " << tensor::to_string(shape)
          << " in the model but " << tensor::dtype_name(model.dtype(key)) << " " << tensor::to_string(model.shape(key))
          << " in the file; ";
  }
  for (const auto& key : model.names())
    if (std::find(state_keys_.begin(), state_keys_.end(), key) == state_keys_.end())
      why << "unexpected '" << key << "'; ";
  if (const std::string error = why.str(); !error.empty()) why.str(model.where() + ": " + error);
  agree_or_throw(why.str(), op);

  std::string error;
  try {
    for (const auto& key : state_keys_) {
      if (aliases_.contains(key)) continue;  // the tensor it names is read under its own name
      if (const auto it = buffers_.find(key); it != buffers_.end()) {
        model.read(key, 0, *it->second);
        continue;
      }
      const auto [u, f] = flat_of_.at(key);
      Flat& flat = units_[u].flats[f];
      const Entry& entry = flat.entries[entry_of_.at(key)];
      const auto [lo, hi] = range(flat, entry);
      if (lo < hi)
        model.read(key, lo - entry.offset,
                   flat.shard->data.slice(lo - me * flat.shard_numel, hi - me * flat.shard_numel));
    }
  } catch (const Error& e) {
    error = e.what();
  }
  agree_or_throw(error, op);
  mark_parameters_stale();

  // The optimizer: its scalars, then one block per slot of each flat, its entries'
  // ranges read in place, handed to the optimizer without a copy.
  nn::StateDict shard = optimizer.scalars();
  why.str("");
  for (const auto& name : optimizer.names()) {
    const std::size_t slash = name.find('/');
    if (slash == std::string::npos || !flat_of_.contains(name.substr(0, slash)))
      why << "unknown parameter in '" << name << "'; ";
  }
  try {
    for (auto& unit : units_)
      for (auto& flat : unit.flats) {
        const std::string first = flat.entries.front().name + "/";
        for (const auto& name : optimizer.names()) {
          if (name.compare(0, first.size(), first) != 0) continue;
          const std::string slot = name.substr(first.size());
          const tensor::DType dtype = optimizer.dtype(name);
          if (optimizer.shape(name).empty()) {
            Tensor value = Tensor::empty({}, dtype);
            optimizer.read(name, 0, value);
            shard.insert(flat.name + "/" + slot, value);
            continue;
          }
          Tensor block = Tensor::zeros({flat.shard_numel}, dtype, flat.device);
          for (const auto& entry : flat.entries) {
            const std::string source = entry.name + "/" + slot;
            if (!optimizer.contains(source) || optimizer.shape(source) != entry.shape ||
                optimizer.dtype(source) != dtype) {
              why << "'" << source << "' is "
                  << (optimizer.contains(source) ? std::string(tensor::dtype_name(optimizer.dtype(source))) + " " +
                                                       tensor::to_string(optimizer.shape(source))
                                                 : std::string("missing"))
                  << ", expected " << tensor::dtype_name(dtype) << " " << tensor::to_string(entry.shape) << "; ";
              continue;
            }
            const auto [lo, hi] = range(flat, entry);
            if (lo < hi)
              optimizer.read(source, lo - entry.offset,
                             block.slice(lo - me * flat.shard_numel, hi - me * flat.shard_numel));
          }
          shard.insert(flat.name + "/" + slot, std::move(block));
        }
      }
  } catch (const Error& e) {
    why << e.what() << "; ";
  }
  error = why.str();
  if (error.empty()) {
    try {
      optimizer_->adopt_state_dict(std::move(shard));
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
  }
  if (!error.empty()) error = optimizer.where() + " (rank " + std::to_string(me) + "): " + error;
  agree_or_throw(error, op);
}

}  // namespace troupe::parallel
