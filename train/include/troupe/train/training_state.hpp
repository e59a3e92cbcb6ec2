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
// Sharded modes (zero1, zero2, fsdp: troupe/parallel/sharded_model.hpp) pass a ShardedStateDicts: the
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
#include "troupe/parallel/state_slices.hpp"

namespace troupe::parallel {
class DistributedDataParallel;
class GradScaler;
class MasterWeights;
}  // namespace troupe::parallel

namespace troupe::train {

class DistributedSampler;

using StateGroups = std::vector<std::pair<std::string, nn::StateDict>>;

class TrainingState {
 public:
  // `ddp`, `scaler` and `master` may be null. The pointed-to objects must outlive this
  // one. With `master` (a bf16/f16 model stepping f32 masters), the model group holds
  // the f32 masters (MasterWeights::state_dict), and loading it restores both exactly.
  TrainingState(nn::Module& model, nn::Optimizer& optimizer, DistributedSampler& sampler,
                parallel::DistributedDataParallel* ddp = nullptr, parallel::GradScaler* scaler = nullptr,
                parallel::MasterWeights* master = nullptr);
  // A sharded model: `optimizer` is this rank's base optimizer (optimizer()); the model
  // and optimizer groups and micro_step are `sharded`'s.
  TrainingState(nn::Module& model, nn::Optimizer& optimizer, DistributedSampler& sampler,
                parallel::ShardedStateDicts& sharded);

  // Optimizer steps taken, and the epoch in progress (the sampler's epoch).
  std::int64_t step = 0;
  std::int64_t epoch = 0;

  StateGroups state_dicts() const;
  // The groups after model and optimizer (sampler, scaler, rng, status), as
  // state_dicts() returns them: small, and a collective only for a pipeline (its rng
  // group gathers the stages' generators).
  StateGroups small_state_dicts() const;
  // A sharded state's model and optimizer groups as this rank's pieces, for the
  // parallel save (ShardedStateDicts::local_state_slices: may be a collective); nullopt
  // when the state is not sharded or its mode has no pieces.
  bool has_local_state_slices() const { return sharded_ != nullptr && sharded_->has_local_state_slices(); }
  std::optional<parallel::LocalStateSlices> local_state_slices() const;
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
  void load_state_slices(const StateGroups& small, const parallel::StateSliceSource& model,
                         const parallel::StateSliceSource& optimizer);

  nn::Module& model() const { return model_; }
  nn::Optimizer& optimizer() const { return optimizer_; }
  DistributedSampler& sampler() const { return sampler_; }

 private:
  void check_small_groups(const StateGroups& groups) const;  // throws naming a missing group
  void load_small_groups(const StateGroups& groups);         // sampler, scaler, rng, status

  nn::Module& model_;
  nn::Optimizer& optimizer_;
  DistributedSampler& sampler_;
  parallel::DistributedDataParallel* ddp_;
  parallel::GradScaler* scaler_;
  parallel::ShardedStateDicts* sharded_ = nullptr;
  parallel::MasterWeights* master_ = nullptr;
};

// A deep copy of `groups`: state_dicts() shares storage with the live tensors, so a
// snapshot that later steps must not change is cloned.
StateGroups clone(const StateGroups& groups);

}  // namespace troupe::train
