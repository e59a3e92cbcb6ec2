// SGD with momentum, dampening, weight decay and Nesterov, torch.optim.SGD.
//
// Per parameter, with g its gradient:
//   g = g + weight_decay * p                          (if weight_decay != 0)
//   b = g on the first step, else momentum * b + (1 - dampening) * g
//   g = g + momentum * b if nesterov, else b          (if momentum != 0)
//   p = p - lr * g
// Slot: "momentum_buffer" (only when momentum != 0). Nesterov needs momentum > 0
// and dampening = 0, as in PyTorch.
#pragma once

#include <vector>

#include "troupe/tensor/fused_optim.hpp"

#include "troupe/nn/optimizer.hpp"

namespace troupe::nn {

class SGD : public Optimizer {
 public:
  SGD(std::vector<NamedParameter> params, double lr, double momentum = 0.0, double dampening = 0.0,
      double weight_decay = 0.0, bool nesterov = false);

  std::string type_name() const override { return "SGD"; }
  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  double weight_decay() const { return weight_decay_; }
  bool nesterov() const { return nesterov_; }

 protected:
  void update(const std::string& name, Parameter& param, StateDict& state) override;
  void finish_step(bool completed) override;
  std::vector<Slot> slots() const override { return {{"momentum_buffer", false}}; }
  std::vector<std::pair<std::string, double>> hyper_parameters() const override;
  void set_hyper_parameter(const std::string& key, double value) override;

 private:
  void check() const;

  std::vector<tensor::SgdEntry> pending_;  // this step's CUDA updates, run by finish_step()

  double momentum_, dampening_, weight_decay_;
  bool nesterov_;
};

}  // namespace troupe::nn
