#include "troupe/nn/linear.hpp"

#include <cmath>

#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

using tensor::Transpose;

namespace {

// Rows of a [..., features] tensor once its leading dimensions are flattened.
std::int64_t leading_rows(const Tensor& t) {
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.shape()[static_cast<std::size_t>(d)];
  return rows;
}

}  // namespace

Linear::Linear(std::int64_t in_features, std::int64_t out_features, tensor::Generator& gen, bool bias, DType dtype,
               tensor::Device device)
    : in_(in_features), out_(out_features) {
  TROUPE_CHECK(in_features >= 0 && out_features >= 0, "Linear: feature counts must be >= 0, got in ", in_features,
               ", out ", out_features);
  TROUPE_CHECK(tensor::is_floating(dtype), "Linear: needs a floating dtype, got ", dtype);
  // kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)), bound = gain*sqrt(3/fan_in) = 1/sqrt(fan_in).
  const double bound = in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0.0;
  weight_ = &register_parameter("weight", tensor::uniform({out_, in_}, -bound, bound, gen, dtype, device));
  if (bias) bias_ = &register_parameter("bias", tensor::uniform({out_}, -bound, bound, gen, dtype, device));
}

Linear::Linear(Parameter& tied_weight) {
  TROUPE_CHECK(tied_weight.data.defined() && tied_weight.data.dim() == 2,
               "Linear: a tied weight must be [out_features, in_features], got ",
               tied_weight.data.defined() ? tensor::to_string(tied_weight.data.shape()) : std::string("undefined"));
  out_ = tied_weight.data.size(0);
  in_ = tied_weight.data.size(1);
  weight_ = &register_shared_parameter("weight", tied_weight);
}

std::string Linear::type_name() const { return "Linear(" + std::to_string(in_) + " -> " + std::to_string(out_) + ")"; }

void Linear::check_input(const Tensor& input, const std::string& op) const {
  TROUPE_CHECK(input.defined(), op, ": input is undefined");
  TROUPE_CHECK(input.dim() >= 1 && input.size(-1) == in_, op, ": input ", tensor::to_string(input.shape()),
               " must end in ", in_, " features");
  TROUPE_CHECK(input.dtype() == weight_->data.dtype(), op, ": input is ", input.dtype(), ", weight is ",
               weight_->data.dtype());
}

Tensor Linear::forward_impl(const Tensor& input) {
  check_input(input, type_name() + ".forward");
  input_ = input;
  const std::int64_t rows = leading_rows(input);
  Tensor y = tensor::linear(input.reshape({rows, in_}), weight_->data, bias_ ? bias_->data : Tensor());
  Shape out_shape = input.shape();
  out_shape.back() = out_;
  return y.reshape(out_shape);
}

Tensor Linear::forward_for_backward_impl(const Tensor& input) {
  check_input(input, type_name() + ".forward");
  input_ = input;
  Shape out_shape = input.shape();
  out_shape.back() = out_;
  return Tensor::empty(out_shape, input.dtype(), input.device());
}

Tensor Linear::backward_impl(const Tensor& grad_output) {
  const std::string op = type_name() + ".backward";
  TROUPE_CHECK(input_.defined(), op, ": called before forward");
  Shape expected = input_.shape();
  expected.back() = out_;
  TROUPE_CHECK(grad_output.defined() && grad_output.shape() == expected && grad_output.dtype() == input_.dtype(), op,
               ": grad_output must be ", input_.dtype(), " ", tensor::to_string(expected), ", got ",
               grad_output.defined() ? tensor::dtype_name(grad_output.dtype()) : "undefined", " ",
               tensor::to_string(grad_output.shape()));
  const std::int64_t rows = leading_rows(input_);
  const Tensor gy = grad_output.reshape({rows, out_});
  const Tensor x = input_.reshape({rows, in_});

  if (bias_) {
    if (!bias_->grad.defined())
      bias_->grad = tensor::sum(gy, 0);
    else
      tensor::add_(grad_for_accumulation(*bias_, op.c_str(), "bias"), tensor::sum(gy, 0));
    grad_ready(*bias_);
  }
  if (WeightGradients* later = deferred_weight_gradients())
    later->defer([this, gy, x, op] { add_weight_gradient(gy, x, op); });
  else
    add_weight_gradient(gy, x, op);
  return tensor::matmul(gy, weight_->data).reshape(input_.shape());
}

// dW (+)= gy^T x, written by the gemm straight into the gradient (beta 0 when fresh).
void Linear::add_weight_gradient(const Tensor& gy, const Tensor& x, const std::string& op) {
  bool fresh = false;
  Tensor& gw = grad_for_write(*weight_, op.c_str(), "weight", fresh);
  tensor::matmul_out(gw, gy, x, Transpose::yes, Transpose::no, 1.0, fresh ? 0.0 : 1.0);
  grad_ready(*weight_);
}

void Linear::exchange_own_activations(ActivationStash& stash) { stash.exchange(input_); }

}  // namespace troupe::nn
