// AdamW, torch.optim.AdamW: Adam with decoupled weight decay (Loshchilov & Hutter),
// p = p * (1 - lr * weight_decay) before the Adam update, instead of adding
// weight_decay * p to the gradient. The update rule is written out in adam.hpp.
#pragma once

#include "troupe/nn/adam.hpp"

namespace troupe::nn {

class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<NamedParameter> params, double lr = 1e-3, Betas betas = {}, double eps = 1e-8,
                 double weight_decay = 1e-2)
      : Adam(std::move(params), lr, betas, eps, weight_decay, true) {}
};

}  // namespace troupe::nn
