#include "troupe/nn/parameter.hpp"

#include "troupe/error.hpp"

namespace troupe::nn {

Tensor& grad_for_accumulation(Parameter& p, const char* op, const std::string& name) {
  bool fresh = false;
  Tensor& grad = grad_for_write(p, op, name, fresh);
  if (fresh) grad.zero_();
  return grad;
}

Tensor& grad_for_write(Parameter& p, const char* op, const std::string& name, bool& fresh) {
  p.data.check_defined(op);
  fresh = !p.grad.defined();
  if (fresh) {
    p.grad = Tensor::empty(p.data.shape(), p.data.dtype(), p.data.device());
    return p.grad;
  }
  TROUPE_CHECK(
      p.grad.shape() == p.data.shape() && p.grad.dtype() == p.data.dtype() && p.grad.device() == p.data.device(), op,
      ": the gradient of '", name, "' is ", p.grad.dtype(), " ", tensor::to_string(p.grad.shape()), " on ",
      p.grad.device(), ", the parameter is ", p.data.dtype(), " ", tensor::to_string(p.data.shape()), " on ",
      p.data.device());
  return p.grad;
}

}  // namespace troupe::nn
