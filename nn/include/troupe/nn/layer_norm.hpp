// LayerNorm over the last dimension, torch.nn.LayerNorm(normalized_size).
//
// y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance of
// each row of `normalized_size` elements. weight starts at ones and bias at zeros;
// elementwise_affine=false has neither. The arithmetic is tensor/nn_ops.hpp's
// layer_norm_forward/backward (double row statistics, a block per row on CUDA); the
// per-row mean and 1/std are kept for the backward, llm.c's layernorm_backward.
#pragma once

#include <cstdint>

#include "troupe/nn/module.hpp"
#include "troupe/tensor/nn_ops.hpp"

namespace troupe::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true,
                     DType dtype = DType::f32, tensor::Device device = tensor::Device::cpu());

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;

  // Null when elementwise_affine is false.
  Parameter* weight() { return weight_; }
  Parameter* bias() { return bias_; }
  std::int64_t normalized_size() const { return size_; }
  double eps() const { return eps_; }

 protected:
  void exchange_own_activations(ActivationStash& stash) override;

 private:
  std::int64_t size_;
  double eps_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  Tensor input_;
  tensor::LayerNormForward saved_;  // each row's mean and 1/std (the output is handed on)
};

}  // namespace troupe::nn
