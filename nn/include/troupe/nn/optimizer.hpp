// Optimizer: the base of SGD, Adam and AdamW.
//
// An optimizer is built from (name, Parameter*) pairs -- usually
// `model.named_parameters()` -- and keys all its state by parameter name, so a
// checkpoint written by one process can be loaded by another that built the same
// model. step() updates every parameter whose grad is defined and skips the rest
// (as PyTorch skips `p.grad is None`). The update math runs in the parameter's own
// dtype (f32 for f32, f64 for f64), on the CPU.
//
// state_dict() holds the hyper-parameters ("lr", "momentum", "betas.0", ...) as 0-dim
// f64 tensors, the number of step() calls as "step" (0-dim i64), and each
// parameter's slots as "<param name>/<slot>" ("0.weight/exp_avg"). load_state_dict()
// checks everything first and reports every problem in one error; a parameter with
// no slots in the dict starts with fresh state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/nn/parameter.hpp"
#include "troupe/nn/state_dict.hpp"

namespace troupe::nn {

class Optimizer {
 public:
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  virtual ~Optimizer() = default;

  void step();
  // Over this optimizer's parameters, with Module::zero_grad's meaning.
  void zero_grad(bool set_to_none = true);

  double lr() const { return lr_; }
  void set_lr(double lr);
  // Calls to step() so far (restored by load_state_dict).
  std::int64_t step_count() const { return step_count_; }
  const std::vector<NamedParameter>& named_parameters() const { return params_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);
  // load_state_dict keeping the dict's slot tensors themselves rather than copies (unless
  // a state allocator places the state elsewhere): a sharded resume builds the slots
  // fresh, so the state is never held twice.
  void adopt_state_dict(StateDict dict);

  // Allocates the per-parameter state tensors (momentum, Adam's moments), contents
  // undefined; by default Tensor::empty on the CPU. FSDP's CPU offload points it at a
  // host pool of its own, so the state lives apart from the compute tensors. Set it
  // before the first step; load_state_dict also copies into tensors it allocates.
  using StateAllocator = std::function<Tensor(const tensor::Shape& shape, tensor::DType dtype)>;
  void set_state_allocator(StateAllocator allocate) { allocate_ = std::move(allocate); }

  virtual std::string type_name() const = 0;

 protected:
  Tensor allocate_state(const tensor::Shape& shape, tensor::DType dtype) const {
    return allocate_ ? allocate_(shape, dtype) : Tensor::empty(shape, dtype);
  }
  // A per-parameter state tensor. `scalar` slots are 0-dim i64 counters (Adam's
  // per-parameter step); the others have the parameter's shape and dtype.
  struct Slot {
    std::string name;
    bool scalar = false;
  };

  Optimizer(std::vector<NamedParameter> params, double lr, const char* type);

  // Updates one parameter with a defined grad. `state` holds its slots by slot
  // name; it is empty on the parameter's first update.
  virtual void update(const std::string& name, Parameter& param, StateDict& state) = 0;
  // Called once after step()'s updates: an optimizer that collected its CUDA updates
  // runs them here, all in one fused launch (tensor/fused_optim.hpp's list forms).
  // `completed` is false when an update threw: drop what was collected, run nothing.
  virtual void finish_step(bool completed) { (void)completed; }
  virtual std::vector<Slot> slots() const = 0;
  // Hyper-parameters other than lr, saved and restored by name.
  virtual std::vector<std::pair<std::string, double>> hyper_parameters() const = 0;
  virtual void set_hyper_parameter(const std::string& key, double value) = 0;

 private:
  void load(const StateDict& dict, bool adopt);
  std::vector<NamedParameter> params_;
  std::vector<StateDict> state_;  // parallel to params_
  StateAllocator allocate_;
  double lr_;
  std::int64_t step_count_ = 0;
};

}  // namespace troupe::nn
