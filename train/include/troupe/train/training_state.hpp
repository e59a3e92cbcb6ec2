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
#pragma once

#include <cstdint>
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

using StateGroups = std::vector<std::pair<std::string, nn::StateDict>>;

class TrainingState {
 public:
  // `ddp` and `scaler` may be null. The pointed-to objects must outlive this one.
  TrainingState(nn::Module& model, nn::Optimizer& optimizer, DistributedSampler& sampler,
                DistributedDataParallel* ddp = nullptr, GradScaler* scaler = nullptr);

  // Optimizer steps taken, and the epoch in progress (the sampler's epoch).
  std::int64_t step = 0;
  std::int64_t epoch = 0;

  StateGroups state_dicts() const;
  // Every group state_dicts() would return must be present (checked, naming what is
  // missing); the model and optimizer are loaded strictly.
  void load_state_dicts(const StateGroups& groups);

  nn::Module& model() const { return model_; }
  nn::Optimizer& optimizer() const { return optimizer_; }
  DistributedSampler& sampler() const { return sampler_; }

 private:
  nn::Module& model_;
  nn::Optimizer& optimizer_;
  DistributedSampler& sampler_;
  DistributedDataParallel* ddp_;
  GradScaler* scaler_;
};

// A deep copy of `groups`: state_dicts() shares storage with the live tensors, so a
// snapshot that later steps must not change is cloned.
StateGroups clone(const StateGroups& groups);

// FNV-1a over every parameter's bytes, in named order: equal on two ranks (or two runs)
// exactly when their parameters are bit-identical.
std::uint64_t parameter_hash(nn::Module& model);

}  // namespace troupe::train
