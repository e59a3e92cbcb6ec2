// Linear: y = x W^T + b, torch.nn.Linear.
//
// weight is [out_features, in_features] and, like bias [out_features], is drawn
// from U(-1/sqrt(in), 1/sqrt(in)) -- what PyTorch's kaiming_uniform_(a=sqrt(5))
// reduces to -- weight first, then bias, from the Generator passed in, so the same
// seed gives the same model on every rank. Input [..., in] gives output [..., out];
// leading dimensions are flattened into rows for one matmul.
//
// backward adds dW += gy^T x (a gemm with beta=1 straight into the existing grad) and
// db += the column sums of gy, marks bias then weight ready, then returns dx = gy W.
// Under Module::defer_weight_gradients, dW's product is queued instead (zero-bubble
// pipelines; weight_gradients.hpp).
// forward keeps a handle to its input: don't write into it before backward.
#pragma once

#include <cstdint>
#include <string>

#include "troupe/nn/module.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::nn {

class Linear : public Module {
 public:
  // On Device::meta() the parameters are described, not computed (tensor/meta.hpp).
  Linear(std::int64_t in_features, std::int64_t out_features, tensor::Generator& gen, bool bias = true,
         DType dtype = DType::f32, tensor::Device device = tensor::Device::cpu());
  // PyTorch's argument order, Linear(in, out, bias, ...).
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias, tensor::Generator& gen,
         DType dtype = DType::f32, tensor::Device device = tensor::Device::cpu())
      : Linear(in_features, out_features, gen, bias, dtype, device) {}

  // Without a bias, its weight another module's [out, in] parameter, shared (GPT's
  // lm_head, tied to the token embedding's [vocab, embd] table).
  explicit Linear(Parameter& tied_weight);

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;

  Parameter& weight() { return *weight_; }
  // Null without a bias.
  Parameter* bias() { return bias_; }
  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }

 protected:
  // Keeps the input; the output is left unset: backward reads only the input.
  Tensor forward_for_backward_impl(const Tensor& input) override;
  void exchange_own_activations(ActivationStash& stash) override;
  // The input forward kept for backward's dW: a subclass may keep it in another form
  // meanwhile (sequence parallelism keeps a part and gathers it again) and put it back.
  Tensor take_saved_input() { return std::move(input_); }
  void restore_saved_input(Tensor input) { input_ = std::move(input); }

 private:
  void check_input(const Tensor& input, const std::string& op) const;
  void add_weight_gradient(const Tensor& gy, const Tensor& x, const std::string& op);

  std::int64_t in_ = 0, out_ = 0;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  Tensor input_;
};

}  // namespace troupe::nn
