// LayerNorm over the last dimension, torch.nn.LayerNorm(normalized_size).
//
// y = (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance of
// each row of `normalized_size` elements. weight starts at ones and bias at zeros;
// elementwise_affine=false has neither. Row statistics are computed in double and
// the per-row mean and 1/std are kept for backward, which is llm.c's
// layernorm_backward:  dx = rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)),
// with dnorm = gy * weight and xhat the normalised input.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/nn/module.hpp"

namespace troupe::nn {

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true,
                     DType dtype = DType::f32);

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;

  // Null when elementwise_affine is false.
  Parameter* weight() { return weight_; }
  Parameter* bias() { return bias_; }
  std::int64_t normalized_size() const { return size_; }
  double eps() const { return eps_; }

 private:
  Tensor forward_on_device(const Tensor& input, std::int64_t rows);
  Tensor backward_on_device(const Tensor& grad_output, std::int64_t rows);

  std::int64_t size_;
  double eps_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  Tensor input_;
  std::vector<double> mean_, rstd_;
  Tensor xhat_, std_;  // on CUDA: the normalised input and each row's std, f64
};

}  // namespace troupe::nn
