#include "troupe/nn/layer_norm.hpp"

#include <sstream>
#include <utility>

#include "troupe/error.hpp"
#include "troupe/tensor/nn_ops.hpp"

namespace troupe::nn {

LayerNorm::LayerNorm(std::int64_t normalized_size, double eps, bool elementwise_affine, DType dtype,
                     tensor::Device device)
    : size_(normalized_size), eps_(eps) {
  TROUPE_CHECK(normalized_size > 0, "LayerNorm: normalized_size must be > 0, got ", normalized_size);
  TROUPE_CHECK(eps >= 0, "LayerNorm: eps must be >= 0, got ", eps);
  TROUPE_CHECK(tensor::is_floating(dtype), "LayerNorm: needs a floating dtype, got ", dtype);
  if (elementwise_affine) {
    weight_ = &register_parameter("weight", Tensor::ones({size_}, dtype, device));
    bias_ = &register_parameter("bias", Tensor::zeros({size_}, dtype, device));
  }
}

std::string LayerNorm::type_name() const {
  std::ostringstream out;
  out << "LayerNorm(" << size_ << ", eps=" << eps_ << ")";
  return out.str();
}

Tensor LayerNorm::forward_impl(const Tensor& input) {
  const std::string op = type_name() + ".forward";
  TROUPE_CHECK(input.defined() && tensor::is_floating(input.dtype()), op, ": needs a floating input");
  TROUPE_CHECK(input.dim() >= 1 && input.size(-1) == size_, op, ": input ", tensor::to_string(input.shape()),
               " must end in ", size_);
  if (weight_)
    TROUPE_CHECK(input.dtype() == weight_->data.dtype() && input.device() == weight_->data.device(), op, ": input is ",
                 input.dtype(), " on ", input.device(), ", weight is ", weight_->data.dtype(), " on ",
                 weight_->data.device());
  input_ = input;
  saved_ = tensor::layer_norm_forward(input, weight_ ? weight_->data : Tensor(), bias_ ? bias_->data : Tensor(), eps_);
  return std::move(saved_.out);  // the backward needs the statistics only
}

Tensor LayerNorm::backward_impl(const Tensor& grad_output) {
  const std::string op = type_name() + ".backward";
  TROUPE_CHECK(input_.defined(), op, ": called before forward");
  TROUPE_CHECK(grad_output.defined() && grad_output.shape() == input_.shape() &&
                   grad_output.dtype() == input_.dtype() && grad_output.device() == input_.device(),
               op, ": grad_output must be ", input_.dtype(), " ", tensor::to_string(input_.shape()), " on ",
               input_.device(), ", got ", grad_output.dtype(), " ", tensor::to_string(grad_output.shape()), " on ",
               grad_output.device());
  if (!weight_) return tensor::layer_norm_backward(grad_output, input_, saved_, Tensor(), nullptr, nullptr);
  Tensor& gb = grad_for_accumulation(*bias_, op.c_str(), "bias");
  Tensor& gw = grad_for_accumulation(*weight_, op.c_str(), "weight");
  Tensor grad_input = tensor::layer_norm_backward(grad_output, input_, saved_, weight_->data, &gw, &gb);
  grad_ready(*bias_);
  grad_ready(*weight_);
  return grad_input;
}

void LayerNorm::exchange_own_activations(ActivationStash& stash) {
  stash.exchange(input_);
  stash.exchange(saved_);
}

}  // namespace troupe::nn
