// Elementwise activations: ReLU, GELU and Tanh, as torch.nn's.
//
// Each caches what its derivative needs (the input, or for Tanh the output) and
// has no parameters. backward(gy) returns gy * f'(x) with the forward's shape.
#pragma once

#include <string_view>

#include "troupe/nn/module.hpp"

namespace troupe::nn {

class ReLU : public Module {
 public:
  Tensor forward_impl(const Tensor& input) override;
  // Gradient 0 at x = 0, as PyTorch.
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override { return "ReLU"; }

 protected:
  void exchange_own_activations(ActivationStash& stash) override;

 private:
  Tensor input_;
};

enum class GeluApproximate { none, tanh };

// none (PyTorch's default): x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
// tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's form.
class GELU : public Module {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::none) : approximate_(approximate) {}
  // PyTorch's spelling: "none" or "tanh".
  explicit GELU(std::string_view approximate);

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;
  GeluApproximate approximate() const { return approximate_; }

 protected:
  void exchange_own_activations(ActivationStash& stash) override;

 private:
  GeluApproximate approximate_;
  Tensor input_;
};

class Tanh : public Module {
 public:
  Tensor forward_impl(const Tensor& input) override;
  // 1 - tanh(x)^2 from the cached output, so no second tanh is evaluated.
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override { return "Tanh"; }

 protected:
  void exchange_own_activations(ActivationStash& stash) override;

 private:
  Tensor output_;
};

}  // namespace troupe::nn
