#include "troupe/parallel/sharded_model.hpp"

#include "troupe/tensor/meta.hpp"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "troupe/error.hpp"
#include "troupe/shard_range.hpp"

namespace troupe::parallel {

AutoWrapPolicy parameterised_leaf_auto_wrap_policy() {
  return [](nn::Module& module, const std::string&, std::int64_t unwrapped_parameters) {
    return unwrapped_parameters > 0 && module.named_children().empty();
  };
}

ShardedModel::ShardedModel(Sharding mode, nn::Module& model, collectives::Communicator& comm,
                           const OptimizerFactory& factory, std::size_t bucket_bytes, FsdpOptions fsdp,
                           collectives::Communicator* tp)
    : mode_(mode), model_(model), comm_(comm), tp_(tp) {
  TROUPE_CHECK(tp == nullptr || mode != Sharding::zero1, "ShardedModel: zero1 over a tensor-parallel model is not ",
               "built (zero2 and fsdp are)");
  // Before FSDP takes the parameters: the layers know their full shapes either way.
  if (tp != nullptr) splits_ = tensor_parallel_splits(model);
  switch (mode) {
    case Sharding::zero1:
      // ZeRO-1 keeps the whole model on every rank: a meta model is materialised whole,
      // the same everywhere, before DDP's broadcast.
      for (const auto& named : model.named_parameters())
        if (tensor::is_meta(named.param->data)) {
          model.to(fsdp.device);
          break;
        }
      ddp_ = std::make_unique<DistributedDataParallel>(model, comm, DdpOptions{.bucket_bytes = bucket_bytes});
      oss_ =
          std::make_unique<OSS>(model.named_parameters(), comm, factory, OssOptions{.sync_bucket_bytes = bucket_bytes});
      break;
    case Sharding::zero2:
    case Sharding::fsdp:
      if (!fsdp.auto_wrap_policy && fsdp.wrap.empty()) fsdp.auto_wrap_policy = parameterised_leaf_auto_wrap_policy();
      fsdp.sharding_strategy = mode == Sharding::zero2 ? FsdpOptions::ShardingStrategy::shard_grad_op
                                                       : FsdpOptions::ShardingStrategy::full_shard;
      fsdp_ = std::make_unique<FullyShardedDataParallel>(model, comm, factory, std::move(fsdp));
      break;
    case Sharding::ddp:
      TROUPE_THROW(InvalidArgument, "ShardedModel: ddp is DistributedDataParallel itself, not a sharded mode");
  }
}

// The wrappers go before the OSS they refer to (members are destroyed in reverse).
ShardedModel::~ShardedModel() {
  ddp_.reset();
  fsdp_.reset();
}

nn::Optimizer& ShardedModel::optimizer() { return fsdp_ ? fsdp_->optimizer() : oss_->base(); }

Tensor ShardedModel::forward(const Tensor& input) { return fsdp_ ? fsdp_->forward(input) : model_.forward(input); }

namespace {
// A synchronising backward, or one under the wrapper's no_sync (accumulating locally).
template <class Wrapper>
void backward_with(Wrapper& wrapper, const Tensor& grad, bool sync) {
  if (sync) {
    wrapper.backward(grad);
    return;
  }
  auto guard = wrapper.no_sync();
  wrapper.backward(grad);
}
}  // namespace

void ShardedModel::backward(const Tensor& grad, bool sync) {
  if (ddp_)
    backward_with(*ddp_, grad, sync);
  else
    backward_with(*fsdp_, grad, sync);
}

// The window arithmetic is DDP's (accumulation.cpp), so every mode takes its steps at
// the same micro-batches and scales each window's gradients the same way.
AccumulationStep ShardedModel::optimizer_step_with_gradient_accumulation(
    const std::function<Tensor(double)>& output_grad, int accum_steps, std::int64_t steps_per_epoch,
    double max_grad_norm) {
  TROUPE_CHECK(accum_steps >= 1, "ShardedModel: accum_steps must be >= 1, got ", accum_steps);
  TROUPE_CHECK(steps_per_epoch >= 1, "ShardedModel: steps_per_epoch must be >= 1, got ", steps_per_epoch);
  TROUPE_CHECK(micro_step_ < steps_per_epoch, "ShardedModel: micro-step ", micro_step_, " is past the epoch's ",
               steps_per_epoch, " steps (steps_per_epoch changed mid-epoch?)");
  TROUPE_CHECK(max_grad_norm >= 0, "ShardedModel: max_grad_norm must be >= 0, got ", max_grad_norm);
  const std::int64_t window_start = micro_step_ / accum_steps * accum_steps;
  const std::int64_t window = std::min<std::int64_t>(accum_steps, steps_per_epoch - window_start);
  const bool last_in_window = micro_step_ + 1 == window_start + window;

  AccumulationStep result;
  result.window = static_cast<int>(window);
  {
    TraceScope span(tracer_, "compute", "backward");
    backward(output_grad(1.0 / static_cast<double>(window)), last_in_window);
  }
  if (last_in_window) {
    TraceScope span(tracer_, "compute", "optimizer");
    result.synced = true;
    // The true global norm: OSS and FSDP sum every rank's share with one all-reduce.
    if (max_grad_norm > 0 && tp_ != nullptr)
      result.grad_norm = fsdp_->clip_grad_norm(max_grad_norm, *tp_,
                                               [this](const std::string& name) { return splits_.contains(name); });
    else if (max_grad_norm > 0)
      result.grad_norm = fsdp_ ? fsdp_->clip_grad_norm(max_grad_norm) : oss_->clip_grad_norm(max_grad_norm);
    if (fsdp_) {
      fsdp_->step();
      fsdp_->zero_grad(true);
    } else {
      oss_->step();  // steps the owned partition, then shares the parameters
      oss_->zero_grad(true);
    }
    result.stepped = true;
  }
  micro_step_ = (micro_step_ + 1) % steps_per_epoch;
  return result;
}

MicroBatchResult ShardedModel::train_micro_batch(const Tensor& inputs, const Tensor& targets, const Loss& loss,
                                                 const MicroBatchOptions& options) {
  MicroBatchResult result;
  {
    const TraceScope span(tracer_, "compute", "forward");
    result.loss = loss.forward(forward(inputs), targets);
  }
  result.stepped = optimizer_step_with_gradient_accumulation(loss.backward, options.accum_steps,
                                                             options.steps_per_epoch, options.max_grad_norm)
                       .stepped;
  return result;
}

void ShardedModel::set_micro_step(std::int64_t step) {
  TROUPE_CHECK(step >= 0, "ShardedModel::set_micro_step: got ", step);
  micro_step_ = step;
}

std::uint64_t ShardedModel::parameter_hash() {
  if (!fsdp_) return nn::parameter_hash(model_);
  // The module's own parameters are undefined between uses: gather each one (in
  // state_dict order), keep the parameters, and hash them in named order as
  // nn::parameter_hash(model) does.
  std::unordered_map<std::string, Tensor> full;
  std::vector<std::string> names;
  for (const auto& named : model_.named_parameters()) names.push_back(named.name);
  fsdp_->for_each_full_tensor([&](const std::string& name, const Tensor& value) {
    if (std::find(names.begin(), names.end(), name) != names.end()) full.emplace(name, value.to(Device::cpu()));
  });
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& name : names) {
    const Tensor& host = full.at(name);
    const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
    for (std::size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return tp_ != nullptr ? combined_hash(h, *tp_) : h;
}

nn::StateDict ShardedModel::model_state_dict() {
  if (!fsdp_) return model_.state_dict();
  return tp_ != nullptr ? full_model_state_dict(fsdp_->full_state_dict(), splits_, *tp_) : fsdp_->full_state_dict();
}

nn::StateDict ShardedModel::optimizer_state_dict() {
  if (!fsdp_) return oss_->state_dict();
  return tp_ != nullptr ? full_optimizer_state_dict(fsdp_->full_optimizer_state_dict(), splits_, *tp_)
                        : fsdp_->full_optimizer_state_dict();
}

std::optional<LocalStateSlices> ShardedModel::local_state_slices() {
  if (tp_ != nullptr) return std::nullopt;  // a part's slices are not ranges of the whole tensor
  LocalStateSlices out;
  if (fsdp_) {
    for (auto& piece : fsdp_->local_model_slices())
      out.model.push_back(
          {std::move(piece.name), piece.dtype, std::move(piece.shape), piece.begin, std::move(piece.data)});
    for (const auto& [key, value] : fsdp_->optimizer().state_dict())
      if (key.find('/') == std::string::npos) out.optimizer_scalars.insert(key, value);
    for (auto& piece : fsdp_->local_optimizer_slices())
      out.optimizer.push_back(
          {std::move(piece.name), piece.dtype, std::move(piece.shape), piece.begin, std::move(piece.data)});
    return out;
  }
  // zero1: every rank holds the whole model, so each writes an even share of it.
  for (const auto& [key, value] : model_.state_dict()) {
    StateSlice slice{key, value.dtype(), value.shape(), 0, Tensor()};
    const auto [begin, end] = shard_range(value.numel(), comm_.rank(), comm_.size());
    if (begin < end) {
      Tensor host = value.device().is_cpu() ? value : value.to(tensor::Device::cpu());
      slice.begin = begin;
      slice.data = host.flatten().slice(begin, end);
    }
    out.model.push_back(std::move(slice));
  }
  LocalStateSlices optimizer = oss_->local_state_slices();
  out.optimizer_scalars = std::move(optimizer.optimizer_scalars);
  out.optimizer = std::move(optimizer.optimizer);
  return out;
}

void ShardedModel::load_local_state_slices(const StateSliceSource& model, const StateSliceSource& optimizer) {
  TROUPE_CHECK(tp_ == nullptr, "ShardedModel: a tensor-parallel model loads whole state dicts, not local slices");
  if (fsdp_) {
    fsdp_->load_local_slices(model, optimizer);
    return;
  }
  // zero1 keeps the whole model: each tensor is read straight into it (the same file
  // on every rank gives the same model); of the optimizer, only the slots of the
  // parameters this rank owns.
  const char* op = "ShardedModel::load_local_state_slices";
  const nn::StateDict live = model_.state_dict();  // the module's own tensors
  std::ostringstream why;
  for (const auto& [key, value] : live) {
    if (!model.contains(key))
      why << "missing '" << key << "'; ";
    else if (model.shape(key) != value.shape() || model.dtype(key) != value.dtype())
      why << "'" << key << "' is " << tensor::dtype_name(value.dtype()) << " " << tensor::to_string(value.shape())
          << " in the model but " << tensor::dtype_name(model.dtype(key)) << " " << tensor::to_string(model.shape(key))
          << " in the file; ";
  }
  for (const auto& key : model.names())
    if (live.find(key) == nullptr) why << "unexpected '" << key << "'; ";
  std::string error = why.str();
  if (!error.empty()) error = model.where() + ": " + error;
  if (error.empty()) {
    try {
      for (const auto& [key, value] : live) model.read(key, 0, value);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  std::int32_t failed = error.empty() ? -1 : comm_.rank();
  if (comm_.size() > 1) comm_.allreduce(collectives::Buffer(&failed, 1), collectives::ReduceOp::max);
  if (!error.empty()) TROUPE_THROW(InvalidArgument, op, ": ", error);
  if (failed >= 0) TROUPE_THROW(InvalidArgument, op, ": rank ", failed, " rejected the model group (see its error)");

  std::unordered_set<std::string> owned;
  for (const auto& named : oss_->partition(comm_.rank())) owned.insert(named.name);
  nn::StateDict mine = optimizer.scalars();
  for (const auto& name : optimizer.names()) {
    const std::size_t slash = name.rfind('/');
    if (slash == std::string::npos || !owned.contains(name.substr(0, slash))) continue;
    Tensor value = Tensor::empty(optimizer.shape(name), optimizer.dtype(name));
    optimizer.read(name, 0, value);
    mine.insert(name, std::move(value));
  }
  oss_->load_state_dict(mine);  // collective; keeps the partition's entries, agrees on the verdict
}

void ShardedModel::load_model_state_dict(const nn::StateDict& dict) {
  // zero1: every rank holds the whole model and reads the same file.
  if (fsdp_)
    fsdp_->load_full_state_dict(tp_ != nullptr ? model_state_dict_part(dict, splits_, *tp_) : dict);
  else
    model_.load_state_dict(dict, /*strict=*/true);
}

void ShardedModel::load_optimizer_state_dict(const nn::StateDict& dict) {
  if (fsdp_)
    fsdp_->load_full_optimizer_state_dict(tp_ != nullptr ? optimizer_state_dict_part(dict, splits_, *tp_) : dict);
  else
    oss_->load_state_dict(dict);
}

}  // namespace troupe::parallel
