// MasterWeights: f32 master copies of a low-precision (bf16/f16) model's parameters,
// for mixed-precision training (Micikevicius et al., 2018; what torch.amp does with
// an f32 model and low-precision autocast, done here with a low-precision model).
//
// The model computes forward and backward in its own dtype -- half the bytes to
// move, and with DDP half the gradient bytes to all-reduce -- but an update much
// smaller than a bf16 parameter's spacing (8 bits of mantissa) would round away to
// nothing, so the optimizer steps f32 masters instead and the model gets the rounded
// result:
//
//   model.to(DType::bf16);                       // before DDP and this object
//   DistributedDataParallel ddp(model, comm);    // bf16 buckets (all-reduced in f32, rounded once)
//   MasterWeights master(model);
//   nn::SGD sgd(master.named_parameters(), lr);  // the optimizer knows only the masters
//   ... ddp.backward(loss_fn.backward(scaler.scale()));
//   master.copy_gradients_to_master();           // widen the averaged gradients
//   scaler.step(sgd); scaler.update();           // unscale + overflow check in f32
//   master.copy_master_to_model();               // round the new values into the model
//
// optimizer_step_with_gradient_accumulation does the three master steps itself when
// given `AccumulationOptions::master`. The masters are named like the model's
// parameters, so the optimizer's state dict lines up with the model's. The model must
// outlive this object and keep its parameters (no Module::to after it).
#pragma once

#include <memory>
#include <vector>

#include "troupe/nn/module.hpp"
#include "troupe/nn/parameter.hpp"

namespace troupe::parallel {

class MasterWeights {
 public:
  // f32 copies of every parameter of `model` (whatever its dtype).
  explicit MasterWeights(nn::Module& model);
  MasterWeights(const MasterWeights&) = delete;
  MasterWeights& operator=(const MasterWeights&) = delete;

  // The masters, with the model's names: what the optimizer is built from.
  std::vector<nn::NamedParameter> named_parameters() const;

  // Each master's grad = the model parameter's grad widened to f32 (a model parameter
  // without a grad leaves its master without one, so the optimizer skips it).
  void copy_gradients_to_master();
  // Each model parameter = its master rounded to the model's dtype.
  void copy_master_to_model();
  // Each master = its model parameter widened (after loading a model state dict).
  void copy_model_to_master();

  // The model's state dict with the f32 masters in place of its parameters, under
  // every name a parameter has (a tied table's two): the full precision a checkpoint
  // should keep (PyTorch's AMP state dicts are f32 too).
  nn::StateDict state_dict(const nn::Module& model) const;
  // Loads such a dict: the masters exactly, the model's parameters rounded from them
  // (what they were when it was saved), its buffers as they are. The parameters may
  // also come in the model's own dtype (a checkpoint of the bf16 model): the masters
  // are then widened from them. Checked like Module::load_state_dict, all or nothing.
  void load_state_dict(nn::Module& model, const nn::StateDict& dict, bool strict = true);

 private:
  struct Pair {
    std::string name;
    nn::Parameter* model = nullptr;
    std::unique_ptr<nn::Parameter> master;  // unique_ptr: the optimizer holds its address
  };
  const Pair* pair_of(const Tensor& value) const;
  std::vector<Pair> pairs_;
};

}  // namespace troupe::parallel
