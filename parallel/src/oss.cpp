#include "troupe/parallel/oss.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "troupe/error.hpp"
#include "troupe/parallel/grad_scaler.hpp"
#include "troupe/tensor/fused_optim.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

namespace {

using tensor::DType;
using tensor::Tensor;

// A rank's slot tensors as one byte string: per entry the key, dtype, shape and raw
// bytes. The state dict is the only thing that crosses ranks in this form.
class Writer {
 public:
  template <class T>
  void put(const T& value) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  std::vector<std::uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<std::uint8_t> bytes_;
};

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size, int rank) : data_(data), size_(size), rank_(rank) {}
  template <class T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof(T)), sizeof(T));
    return value;
  }
  const std::uint8_t* take(std::size_t n) {
    TROUPE_CHECK(n <= size_ - at_, "OSS::state_dict: rank ", rank_, "'s state is truncated at byte ", at_);
    const std::uint8_t* p = data_ + at_;
    at_ += n;
    return p;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
  int rank_;
};

bool is_slot_key(const std::string& key) { return key.find('/') != std::string::npos; }
std::string param_of(const std::string& key) { return key.substr(0, key.rfind('/')); }

}  // namespace

std::vector<int> partition_parameters(const std::vector<nn::NamedParameter>& params, int world_size) {
  TROUPE_CHECK(world_size >= 1, "partition_parameters: world_size must be >= 1, got ", world_size);
  std::vector<std::size_t> order(params.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const auto bytes = [&](std::size_t i) {
    TROUPE_CHECK(params[i].param != nullptr && params[i].param->data.defined(), "partition_parameters: parameter '",
                 params[i].name, "' has no data");
    return params[i].param->data.nbytes();
  };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return bytes(a) > bytes(b); });
  std::vector<std::size_t> load(static_cast<std::size_t>(world_size), 0);
  std::vector<int> owners(params.size(), 0);
  for (std::size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // first minimum: lowest rank
    owners[i] = static_cast<int>(least - load.begin());
    *least += bytes(i);
  }
  return owners;
}

OSS::OSS(std::vector<nn::NamedParameter> params, collectives::Communicator& comm, const OptimizerFactory& factory,
         OssOptions options)
    : params_(std::move(params)), comm_(comm), sync_bucket_bytes_(options.sync_bucket_bytes) {
  TROUPE_CHECK(static_cast<bool>(factory), "OSS: the optimizer factory is empty");
  TROUPE_CHECK(options.sync_bucket_bytes > 0, "OSS: sync_bucket_bytes must be > 0");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    TROUPE_CHECK(params_[i].param != nullptr && params_[i].param->data.defined(), "OSS: parameter '", params_[i].name,
                 "' has no data");
    const auto [it, fresh] = index_.emplace(params_[i].name, i);
    TROUPE_CHECK(fresh, "OSS: parameter name '", params_[i].name, "' appears twice");
  }
  owners_ = partition_parameters(params_, comm_.size());
  base_ = factory(partition(comm_.rank()));
  TROUPE_CHECK(base_ != nullptr, "OSS: the optimizer factory returned null");
  TROUPE_CHECK(base_->named_parameters().size() == partition(comm_.rank()).size(), "OSS: the factory built ",
               base_->type_name(), " over ", base_->named_parameters().size(), " parameters, it was given ",
               partition(comm_.rank()).size());

  bool uniform = true;
  for (const auto& [name, p] : params_)
    uniform = uniform && p->data.dtype() == params_.front().param->data.dtype() && p->data.device().is_cpu();
  switch (options.sync) {
    case OssOptions::Sync::automatic: all_gather_ = false; break;
    case OssOptions::Sync::all_gather:
      TROUPE_CHECK(uniform, "OSS: Sync::all_gather needs every parameter in one dtype on the CPU; use broadcast");
      all_gather_ = true;
      break;
    case OssOptions::Sync::broadcast: all_gather_ = false; break;
  }
  if (all_gather_ && !params_.empty()) build_flat_layout();
}

// Each rank's partition packed in named order; every segment as long as the largest
// partition, since all_gather moves equal counts.
void OSS::build_flat_layout() {
  const int world = comm_.size();
  std::vector<std::int64_t> fill(static_cast<std::size_t>(world), 0);
  flat_offset_.assign(params_.size(), 0);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& used = fill[static_cast<std::size_t>(owners_[i])];
    flat_offset_[i] = used;
    used += params_[i].param->data.numel();
  }
  segment_ = std::max<std::int64_t>(1, *std::max_element(fill.begin(), fill.end()));
}

int OSS::owner(const std::string& name) const {
  const auto it = index_.find(name);
  TROUPE_CHECK(it != index_.end(), "OSS: '", name, "' is not one of the ", params_.size(), " parameters");
  return owners_[it->second];
}

std::vector<nn::NamedParameter> OSS::partition(int rank) const {
  std::vector<nn::NamedParameter> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (owners_[i] == rank) out.push_back(params_[i]);
  return out;
}

std::vector<std::size_t> OSS::partition_bytes() const {
  std::vector<std::size_t> out(static_cast<std::size_t>(comm_.size()), 0);
  for (std::size_t i = 0; i < params_.size(); ++i)
    out[static_cast<std::size_t>(owners_[i])] += params_[i].param->data.nbytes();
  return out;
}

std::size_t OSS::local_state_bytes() const {
  std::size_t total = 0;
  for (const auto& [key, value] : base_->state_dict())
    if (is_slot_key(key)) total += value.nbytes();
  return total;
}

void OSS::step() {
  base_->step();
  share();
}

bool OSS::step(GradScaler& scaler) {
  const bool stepped = scaler.step(*base_);  // every rank gets the same verdict
  if (stepped) share();
  return stepped;
}

void OSS::share() {
  if (comm_.size() == 1 || params_.empty()) return;
  if (all_gather_)
    share_by_all_gather();
  else
    share_by_broadcast();
}

// Each rank's partition sits packed in its segment of a virtual flat buffer (segment_
// elements per rank). It is moved a window at a time -- elements [lo, hi) of every
// segment, all-gathered in place through one buffer of W windows -- so the step holds
// at most sync_bucket_bytes more than the parameters, never a second copy of them.
void OSS::share_by_all_gather() {
  const int me = comm_.rank();
  const std::int64_t world = comm_.size();
  const Tensor& first = params_.front().param->data;
  const std::int64_t element = static_cast<std::int64_t>(first.element_bytes());
  const std::int64_t window =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(sync_bucket_bytes_) / element / world, 1, segment_);
  const Tensor buffer = Tensor::empty({window * world}, first.dtype());
  // Copies the part of parameter i inside [lo, hi) of its owner's segment between the
  // parameter and the owner's window of the buffer.
  const auto move = [&](std::size_t i, std::int64_t lo, std::int64_t hi, bool into_buffer) {
    Tensor& data = params_[i].param->data;
    const std::int64_t begin = std::max(lo, flat_offset_[i]), end = std::min(hi, flat_offset_[i] + data.numel());
    if (begin >= end) return;
    Tensor part = data.reshape({data.numel()}).slice(begin - flat_offset_[i], end - flat_offset_[i]);
    Tensor slot = buffer.slice(owners_[i] * window + begin - lo, owners_[i] * window + end - lo);
    if (into_buffer)
      slot.copy_(part);
    else
      part.copy_(slot);
  };
  for (std::int64_t lo = 0; lo < segment_; lo += window) {
    const std::int64_t hi = std::min(segment_, lo + window);
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (owners_[i] == me) move(i, lo, hi, true);
    comm_.allgather(collectives::Buffer(buffer));  // in place: our window is the input
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (owners_[i] != me) move(i, lo, hi, false);
  }
}

void OSS::share_by_broadcast() {
  std::vector<collectives::Work> works;
  works.reserve(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    works.push_back(comm_.broadcast_async(collectives::Buffer(params_[i].param->data), owners_[i]));
  for (auto& work : works)
    if (!work.wait_on_device()) work.wait();  // NCCL: the next forward's stream waits
}

void OSS::zero_grad(bool set_to_none) {
  for (auto& [name, param] : params_) {
    if (set_to_none)
      param->grad = Tensor();
    else if (param->grad.defined())
      param->grad.zero_();
  }
}

namespace {

// A rank's slot tensors as one byte string: their count, then per slot its key, dtype
// and shape (a StateSlice without data), followed by its bytes when `with_bytes`.
std::vector<std::uint8_t> encode_slots(const nn::StateDict& local, bool with_bytes) {
  Writer writer;
  std::uint64_t count = 0;
  for (const auto& [key, value] : local) count += is_slot_key(key) ? 1 : 0;
  writer.put(count);
  for (const auto& [key, value] : local) {
    if (!is_slot_key(key)) continue;
    writer.put(static_cast<std::uint32_t>(key.size()));
    writer.put_bytes(key.data(), key.size());
    writer.put(static_cast<std::uint8_t>(value.dtype()));
    writer.put(static_cast<std::uint32_t>(value.dim()));
    for (auto d : value.shape()) writer.put(static_cast<std::int64_t>(d));
    if (!with_bytes) continue;
    const Tensor host = value.to(tensor::Device::cpu());
    writer.put(static_cast<std::uint64_t>(host.nbytes()));
    writer.put_bytes(host.raw_data(), host.nbytes());
  }
  return std::move(writer.bytes());
}

// Every rank's byte string: rank r's at [r * stride, r * stride + sizes[r]) of `all`
// (two all-gathers: the sizes, then the strings padded to the longest).
struct AllRanks {
  std::vector<std::uint8_t> all;
  std::vector<std::int64_t> sizes;
  std::int64_t stride = 0;
};
AllRanks allgather_bytes(collectives::Communicator& comm, std::vector<std::uint8_t> mine) {
  AllRanks out;
  const int world = comm.size();
  out.sizes.assign(static_cast<std::size_t>(world), 0);
  out.sizes[static_cast<std::size_t>(comm.rank())] = static_cast<std::int64_t>(mine.size());
  out.stride = static_cast<std::int64_t>(mine.size());
  if (world == 1) {
    out.all = std::move(mine);
    return out;
  }
  comm.allgather(collectives::Buffer(out.sizes));
  out.stride = *std::max_element(out.sizes.begin(), out.sizes.end());
  out.all.assign(static_cast<std::size_t>(out.stride * world), 0);
  std::memcpy(out.all.data() + comm.rank() * out.stride, mine.data(), mine.size());
  comm.allgather(collectives::Buffer(out.all.data(), out.all.size(), DType::u8));
  return out;
}

// Calls fn(rank, slot, reader) for every slot of every rank's string, in order; `slot`
// has the key, dtype and shape, and `reader` is at its bytes (if they were sent).
template <class Fn>
void decode_slots(const AllRanks& ranks, Fn&& fn) {
  for (int r = 0; r < static_cast<int>(ranks.sizes.size()); ++r) {
    Reader reader(ranks.all.data() + r * ranks.stride,
                  static_cast<std::size_t>(ranks.sizes[static_cast<std::size_t>(r)]), r);
    const auto n = reader.get<std::uint64_t>();
    for (std::uint64_t k = 0; k < n; ++k) {
      StateSlice slot;
      const auto key_size = reader.get<std::uint32_t>();
      slot.name.assign(reinterpret_cast<const char*>(reader.take(key_size)), key_size);
      slot.dtype = static_cast<DType>(reader.get<std::uint8_t>());
      const auto dims = reader.get<std::uint32_t>();
      for (std::uint32_t d = 0; d < dims; ++d) slot.shape.push_back(reader.get<std::int64_t>());
      fn(r, std::move(slot), reader);
    }
  }
}

}  // namespace

nn::StateDict OSS::state_dict() const {
  const nn::StateDict local = base_->state_dict();
  const AllRanks ranks = allgather_bytes(comm_, encode_slots(local, /*with_bytes=*/true));

  // Every rank's slots by parameter name, in the owner's order.
  std::unordered_map<std::string, std::vector<std::pair<std::string, Tensor>>> slots;
  decode_slots(ranks, [&](int r, StateSlice slot, Reader& reader) {
    const auto nbytes = reader.get<std::uint64_t>();
    Tensor t = Tensor::empty(slot.shape, slot.dtype);
    TROUPE_CHECK(t.nbytes() == nbytes, "OSS::state_dict: rank ", r, " sent ", nbytes, " bytes for '", slot.name,
                 "', its shape needs ", t.nbytes());
    std::memcpy(t.raw_data(), reader.take(nbytes), nbytes);
    std::string param = param_of(slot.name);
    slots[param].emplace_back(std::move(slot.name), std::move(t));
  });

  nn::StateDict out;
  for (const auto& [key, value] : local)
    if (!is_slot_key(key)) out.insert(key, value);
  for (const auto& [name, param] : params_) {
    const auto it = slots.find(name);
    if (it == slots.end()) continue;
    for (auto& [key, value] : it->second) out.insert(key, value);
  }
  return out;
}

LocalStateSlices OSS::local_state_slices() const {
  const nn::StateDict local = base_->state_dict();
  // Every rank's slots' names, dtypes and shapes; the bytes stay where they are.
  const AllRanks ranks = allgather_bytes(comm_, encode_slots(local, /*with_bytes=*/false));
  std::unordered_map<std::string, std::vector<StateSlice>> slots;  // by parameter, in the owner's order
  decode_slots(ranks, [&](int r, StateSlice slot, Reader&) {
    if (r == comm_.rank()) {
      const Tensor& value = local.at(slot.name);
      slot.data = value.device().is_cpu() ? value : value.to(tensor::Device::cpu());
    }
    std::string param = param_of(slot.name);
    slots[param].push_back(std::move(slot));
  });

  LocalStateSlices out;
  for (const auto& [key, value] : local)
    if (!is_slot_key(key)) out.optimizer_scalars.insert(key, value);
  for (const auto& [name, param] : params_) {
    const auto it = slots.find(name);
    if (it == slots.end()) continue;
    for (auto& slice : it->second) out.optimizer.push_back(std::move(slice));
  }
  return out;
}

void OSS::load_state_dict(const nn::StateDict& dict) {
  std::string problem;
  nn::StateDict mine;
  std::vector<std::string> unknown;
  for (const auto& [key, value] : dict) {
    if (!is_slot_key(key)) {
      mine.insert(key, value);
      continue;
    }
    const auto it = index_.find(param_of(key));
    if (it == index_.end())
      unknown.push_back(key);
    else if (owners_[it->second] == comm_.rank())
      mine.insert(key, value);
  }
  if (!unknown.empty()) {
    problem = "OSS::load_state_dict: " + std::to_string(unknown.size()) + " key(s) name no parameter of this model, " +
              "first '" + unknown.front() + "'";
  }
  const nn::StateDict previous = base_->state_dict();
  bool loaded = false;
  if (problem.empty()) {
    try {
      base_->load_state_dict(mine);
      loaded = true;
    } catch (const Error& e) {
      problem = std::string("OSS::load_state_dict on rank ") + std::to_string(comm_.rank()) + ": " + e.what();
    }
  }
  // Agree on the verdict, so that no rank trains on with a different optimizer state.
  std::int32_t failed = problem.empty() ? 0 : comm_.rank() + 1;  // 1 + the highest failing rank
  if (comm_.size() > 1) comm_.allreduce(collectives::Buffer(&failed, 1), collectives::ReduceOp::max);
  if (failed == 0) return;
  if (loaded) base_->load_state_dict(previous);
  if (problem.empty())
    problem = "OSS::load_state_dict: rank " + std::to_string(failed - 1) + " rejected the state dict (see its error)";
  TROUPE_THROW(InvalidArgument, problem);
}

double OSS::clip_grad_norm(double max_norm) {
  TROUPE_CHECK(max_norm >= 0, "OSS::clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  double sum_squares = 0;
  // f32 gradients on a GPU are summed and scaled in list launches (one read-back):
  // a norm read back per parameter waited for the GPU once per parameter.
  std::vector<Tensor*> on_gpu, others;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor& g = params_[i].param->grad;
    if (owners_[i] != comm_.rank() || !g.defined()) continue;
    (g.device().is_cuda() && g.dtype() == tensor::DType::f32 ? on_gpu : others).push_back(&g);
  }
  for (const Tensor* g : others) {
    const double n = tensor::norm(*g).item();
    sum_squares += n * n;
  }
  if (!on_gpu.empty())
    sum_squares += tensor::fused_sum_of_squares(std::vector<const Tensor*>(on_gpu.begin(), on_gpu.end()));
  if (comm_.size() > 1) comm_.allreduce(collectives::Buffer(&sum_squares, 1), collectives::ReduceOp::sum);
  const double total = std::sqrt(sum_squares);
  const double factor = max_norm / (total + 1e-6);  // PyTorch's guard against all-zero gradients
  if (factor < 1) {
    for (Tensor* g : others) tensor::scale_(*g, factor);
    if (!on_gpu.empty()) tensor::fused_scale_(on_gpu, factor);
  }
  return total;
}

}  // namespace troupe::parallel
