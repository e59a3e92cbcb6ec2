#include "troupe/nn/activation.hpp"

#include "troupe/error.hpp"
#include "troupe/tensor/nn_ops.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

namespace {

// The forward's input must be floating; the tensor ops below check the rest (shape,
// dtype and device of the gradient) and run on the tensor's device.
const Tensor& checked(const Tensor& input, const char* op) {
  TROUPE_CHECK(input.defined(), op, ": input is undefined");
  TROUPE_CHECK(tensor::is_floating(input.dtype()), op, ": needs a floating dtype, got ", input.dtype());
  return input;
}

void check_forward_ran(const Tensor& saved, const char* op) {
  TROUPE_CHECK(saved.defined(), op, ": called before forward");
}

}  // namespace

Tensor ReLU::forward_impl(const Tensor& input) {
  input_ = checked(input, "ReLU.forward");
  return tensor::relu(input);
}

Tensor ReLU::backward_impl(const Tensor& grad_output) {
  check_forward_ran(input_, "ReLU.backward");
  return tensor::relu_backward(grad_output, input_);
}

GELU::GELU(std::string_view approximate) {
  if (approximate == "none")
    approximate_ = GeluApproximate::none;
  else if (approximate == "tanh")
    approximate_ = GeluApproximate::tanh;
  else
    TROUPE_THROW(InvalidArgument, "GELU: approximate must be 'none' or 'tanh', got '", approximate, "'");
}

std::string GELU::type_name() const {
  return approximate_ == GeluApproximate::tanh ? "GELU(approximate='tanh')" : "GELU";
}

Tensor GELU::forward_impl(const Tensor& input) {
  input_ = checked(input, "GELU.forward");
  return tensor::gelu(input, approximate_ == GeluApproximate::tanh);
}

Tensor GELU::backward_impl(const Tensor& grad_output) {
  check_forward_ran(input_, "GELU.backward");
  return tensor::gelu_backward(grad_output, input_, approximate_ == GeluApproximate::tanh);
}

Tensor Tanh::forward_impl(const Tensor& input) {
  output_ = tensor::tanh(checked(input, "Tanh.forward"));
  return output_;
}

Tensor Tanh::backward_impl(const Tensor& grad_output) {
  check_forward_ran(output_, "Tanh.backward");
  return tensor::tanh_backward(grad_output, output_);
}

void ReLU::exchange_own_activations(ActivationStash& stash) { stash.exchange(input_); }
void GELU::exchange_own_activations(ActivationStash& stash) { stash.exchange(input_); }
void Tanh::exchange_own_activations(ActivationStash& stash) { stash.exchange(output_); }

}  // namespace troupe::nn
