#include "troupe/nn/parameter.hpp"

#include "troupe/error.hpp"

namespace troupe::nn {

Tensor& grad_for_accumulation(Parameter& p, const char* op, const std::string& name) {
  p.data.check_defined(op);
  if (!p.grad.defined()) {
    p.grad = Tensor::zeros(p.data.shape(), p.data.dtype(), p.data.device());
    return p.grad;
  }
  TROUPE_CHECK(p.grad.shape() == p.data.shape() && p.grad.dtype() == p.data.dtype() &&
                   p.grad.device() == p.data.device(),
               op, ": the gradient of '", name, "' is ", p.grad.dtype(), " ", tensor::to_string(p.grad.shape()),
               " on ", p.grad.device(), ", the parameter is ", p.data.dtype(), " ",
               tensor::to_string(p.data.shape()), " on ", p.data.device());
  return p.grad;
}

}  // namespace troupe::nn
