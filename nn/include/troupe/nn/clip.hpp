// Gradient clipping by global norm, torch.nn.utils.clip_grad_norm_.
//
// total = sqrt(sum over parameters of ||grad||^2), accumulated in double; when
// max_norm / (total + 1e-6) < 1 every grad is scaled in place by that factor.
// Undefined grads are skipped. The total (before clipping) is returned so a caller
// can log it, or skip a step when it is not finite -- in that case the grads are
// left as they are.
#pragma once

#include <vector>

#include "troupe/nn/parameter.hpp"

namespace troupe::nn {

double clip_grad_norm(const std::vector<NamedParameter>& params, double max_norm);
double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm);

}  // namespace troupe::nn
