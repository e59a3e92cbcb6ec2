// Adam, torch.optim.Adam (amsgrad=False), with L2 weight decay added to the
// gradient; AdamW (adamw.hpp) reuses it with decoupled weight decay.
//
// Per parameter, with g its gradient and t its own step count (a parameter
// skipped for lack of a grad does not advance its t, as in PyTorch):
//   g = g + weight_decay * p                 (Adam, if weight_decay != 0)
//   p = p * (1 - lr * weight_decay)          (AdamW, before anything else)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g^2
//   step_size = lr / (1 - beta1^t)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p = p - step_size * m / denom
// Slots: "step" (0-dim i64), "exp_avg" (m), "exp_avg_sq" (v); m and v start at 0.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/nn/optimizer.hpp"
#include "troupe/tensor/fused_optim.hpp"

namespace troupe::nn {

struct Betas {
  double beta1 = 0.9;
  double beta2 = 0.999;
};

// Weight decay on weight matrices and embedding tables, not on biases or norms.
inline bool decay_matrices_only(const std::string&, const tensor::Shape& shape) { return shape.size() >= 2; }

class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<NamedParameter> params, double lr = 1e-3, Betas betas = {}, double eps = 1e-8,
                double weight_decay = 0.0);

  std::string type_name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  Betas betas() const { return betas_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }
  // Which parameters weight decay applies to (all, by default): PyTorch's parameter
  // groups for the common case, e.g. decay_matrices_only as nanoGPT configures AdamW.
  // It is asked with each model parameter's name and full shape, also for the parts
  // of them that a flat shard packs (Parameter::segments), so FSDP and ZeRO-2 decay
  // exactly what DDP decays.
  using DecayFilter = std::function<bool(const std::string& name, const tensor::Shape& shape)>;
  void set_weight_decay_filter(DecayFilter decays) { decays_ = std::move(decays); }

 protected:
  // For AdamW: decoupled = true applies weight decay to the parameter directly.
  Adam(std::vector<NamedParameter> params, double lr, Betas betas, double eps, double weight_decay, bool decoupled);

  void update(const std::string& name, Parameter& param, StateDict& state) override;
  void finish_step(bool completed) override;
  std::vector<Slot> slots() const override { return {{"step", true}, {"exp_avg", false}, {"exp_avg_sq", false}}; }
  std::vector<std::pair<std::string, double>> hyper_parameters() const override;
  void set_hyper_parameter(const std::string& key, double value) override;

 private:
  void check() const;

  // Elements [begin, end) of a parameter that share one weight decay.
  struct DecayRun {
    std::int64_t begin, end;
    double weight_decay;
  };
  std::vector<DecayRun> decay_runs(const std::string& name, const Parameter& param) const;

  std::vector<tensor::AdamEntry> pending_;  // this step's CUDA updates, run by finish_step()
  std::deque<Tensor> pending_views_;        // their slices of flat shards (stable addresses)

  DecayFilter decays_;
  Betas betas_;
  double eps_, weight_decay_;
  bool decoupled_;
};

}  // namespace troupe::nn
