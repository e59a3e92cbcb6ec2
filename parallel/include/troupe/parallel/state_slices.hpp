// The vocabulary of state spread over ranks: a rank's pieces of a full state dict
// (StateSlice, LocalStateSlices) for the parallel save, a file group read by ranges
// (StateSliceSource) for the sharded resume, and the interface of a model whose state is
// sharded (ShardedStateDicts), which train's TrainingState saves and loads without
// knowing the mode.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "troupe/nn/state_dict.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel {

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
  // The whole model's Dropout generator states (the checkpoint's rng group) from this
  // rank's: the same where every rank holds every layer; a pipeline gathers its stages'
  // (a collective then).
  virtual nn::StateDict whole_random_state(nn::StateDict local) { return local; }
};

}  // namespace troupe::parallel
