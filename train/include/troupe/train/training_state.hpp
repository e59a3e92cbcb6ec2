// TrainingState: everything a run needs to continue exactly where it stopped, reachable
// from one place, so that a checkpoint saves it and a restart restores it.
//
// It does not own the pieces; it points at them (they live in the worker) and holds
// the counters of the loop itself. state_dicts() returns one StateDict per group,
// named like the checkpoint file's groups (DESIGN.md, "Checkpoint file"):
//   model      parameters and buffers (Module::state_dict)
//   optimizer  hyper-parameters, step count, per-parameter slots
//   sampler    seed, epoch, position inside the epoch (DistributedSampler)
//   scaler     loss scale and growth tracker (only with a GradScaler)
//   rng        seed and offset of every Dropout's generator, by module name
//   status     step (optimizer steps), epoch, micro_step (DDP's accumulation position)
// load_state_dicts() takes the same groups back; with identical groups the next step
// is bit-for-bit the one the saved run would have taken.
//
// Sharded modes (zero1, zero2, fsdp: sharded_model.hpp) pass a ShardedStateDicts: the
// model and optimizer groups then come from it -- full, unsharded dicts under the
// unwrapped model's names, built by collectives -- so the file has DDP's layout, and
// state_dicts()/load_state_dicts() become collectives that every rank calls together.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/nn/module.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/nn/state_dict.hpp"

namespace troupe::train {

class DistributedDataParallel;
class DistributedSampler;
class GradScaler;
class MasterWeights;

using StateGroups = std::vector<std::pair<std::string, nn::StateDict>>;

// This rank's piece of one tensor of a full (unsharded) state dict, for the parallel
// save (checkpoint::ParallelCheckpoint; checkpoint::Slice is {begin, data}): elements
// [begin, begin + data.numel()) of the flattened tensor `name` of `dtype` and `shape`;
// data undefined when this rank holds none of it. Over all ranks the pieces tile it.
struct StateSlice {
  std::string name;
  tensor::DType dtype = tensor::DType::f32;
  tensor::Shape shape;
  std::int64_t begin = 0;
  tensor::Tensor data;
};

// The model and optimizer groups as each rank's pieces, with no tensor gathered.
struct LocalStateSlices {
  std::vector<StateSlice> model;      // model_state_dict()'s entries, in its order
  nn::StateDict optimizer_scalars;    // optimizer_state_dict()'s entries without '/' (lr, step,
                                      // hyper-parameters): the same, whole, on every rank
  std::vector<StateSlice> optimizer;  // its "<param>/<slot>" entries, in its order
};

// One group of a checkpoint file (model or optimizer) read by ranges: a sharded resume
// reads only the slices each rank keeps. Reads convert to dst's dtype as copy_ does.
class StateSliceSource {
 public:
  virtual ~StateSliceSource() = default;
  // The group's tensor names ("fc.weight", "fc.weight/exp_avg"), in file order.
  virtual const std::vector<std::string>& names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  virtual tensor::DType dtype(const std::string& name) const = 0;
  virtual tensor::Shape shape(const std::string& name) const = 0;
  // Elements [begin, begin + dst.numel()) of tensor `name`, flattened, into dst.
  virtual void read(const std::string& name, std::int64_t begin, const tensor::Tensor& dst) const = 0;
  // The group's scalar attributes (an optimizer's lr and hyper-parameters) as 0-dim tensors.
  virtual nn::StateDict scalars() const = 0;
  // The file and group, for error messages.
  virtual std::string where() const = 0;
};

// The model and optimizer groups of a model whose state is sharded over the ranks, and
// its accumulation position (DDP's micro_step). Each method may be a collective.
class ShardedStateDicts {
 public:
  virtual ~ShardedStateDicts() = default;
  // Whether local_state_slices() is available (no communication).
  virtual bool has_local_state_slices() const { return false; }
  // The groups as this rank's pieces (may be a collective that moves names, never
  // tensors); nullopt when has_local_state_slices() is false.
  virtual std::optional<LocalStateSlices> local_state_slices() { return std::nullopt; }
  // Whether load_local_state_slices() is available (no communication).
  virtual bool loads_local_state_slices() const { return false; }
  // Collective: loads the model and optimizer groups reading only this rank's slices of
  // each tensor, from a file of any mode or world size; a bad group makes every rank
  // throw, naming the file, tensor and rank.
  virtual void load_local_state_slices(const StateSliceSource& /*model*/, const StateSliceSource& /*optimizer*/) {}
  virtual nn::StateDict model_state_dict() = 0;      // the unwrapped model's state_dict()
  virtual nn::StateDict optimizer_state_dict() = 0;  // the unsharded optimizer's
  virtual void load_model_state_dict(const nn::StateDict& dict) = 0;
  virtual void load_optimizer_state_dict(const nn::StateDict& dict) = 0;
  virtual std::int64_t micro_step() const = 0;
  virtual void set_micro_step(std::int64_t step) = 0;
};

class TrainingState {
 public:
  // `ddp`, `scaler` and `master` may be null. The pointed-to objects must outlive this
  // one. With `master` (a bf16/f16 model stepping f32 masters), the model group holds
  // the f32 masters (MasterWeights::state_dict), and loading it restores both exactly.
  TrainingState(nn::Module& model, nn::Optimizer& optimizer, DistributedSampler& sampler,
                DistributedDataParallel* ddp = nullptr, GradScaler* scaler = nullptr, MasterWeights* master = nullptr);
  // A sharded model: `optimizer` is this rank's base optimizer (optimizer()); the model
  // and optimizer groups and micro_step are `sharded`'s.
  TrainingState(nn::Module& model, nn::Optimizer& optimizer, DistributedSampler& sampler, ShardedStateDicts& sharded);

  // Optimizer steps taken, and the epoch in progress (the sampler's epoch).
  std::int64_t step = 0;
  std::int64_t epoch = 0;

  StateGroups state_dicts() const;
  // The groups after model and optimizer (sampler, scaler, rng, status), as
  // state_dicts() returns them: small, and never a collective.
  StateGroups small_state_dicts() const;
  // A sharded state's model and optimizer groups as this rank's pieces, for the
  // parallel save (ShardedStateDicts::local_state_slices: may be a collective); nullopt
  // when the state is not sharded or its mode has no pieces.
  bool has_local_state_slices() const { return sharded_ != nullptr && sharded_->has_local_state_slices(); }
  std::optional<LocalStateSlices> local_state_slices() const;
  // The names of state_dicts()'s groups, in its order, without building them.
  std::vector<std::string> group_names() const;
  // Whether state_dicts()/load_state_dicts() are collectives (a sharded model).
  bool collective() const { return sharded_ != nullptr; }
  // Every group state_dicts() would return must be present (checked, naming what is
  // missing); the model and optimizer are loaded strictly.
  void load_state_dicts(const StateGroups& groups);
  // A sharded resume: whether the sharded state can load its own slices, and the load
  // itself -- the small groups whole (as small_state_dicts() returns them), the model
  // and optimizer through their sources. Collective.
  bool loads_local_state_slices() const { return sharded_ != nullptr && sharded_->loads_local_state_slices(); }
  void load_state_slices(const StateGroups& small, const StateSliceSource& model, const StateSliceSource& optimizer);

  nn::Module& model() const { return model_; }
  nn::Optimizer& optimizer() const { return optimizer_; }
  DistributedSampler& sampler() const { return sampler_; }

 private:
  void check_small_groups(const StateGroups& groups) const;  // throws naming a missing group
  void load_small_groups(const StateGroups& groups);         // sampler, scaler, rng, status

  nn::Module& model_;
  nn::Optimizer& optimizer_;
  DistributedSampler& sampler_;
  DistributedDataParallel* ddp_;
  GradScaler* scaler_;
  ShardedStateDicts* sharded_ = nullptr;
  MasterWeights* master_ = nullptr;
};

// A deep copy of `groups`: state_dicts() shares storage with the live tensors, so a
// snapshot that later steps must not change is cloned.
StateGroups clone(const StateGroups& groups);

// FNV-1a over every parameter's bytes, in named order: equal on two ranks (or two runs)
// exactly when their parameters are bit-identical.
std::uint64_t parameter_hash(nn::Module& model);

}  // namespace troupe::train
