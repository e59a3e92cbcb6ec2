// Dropout: inverted dropout, torch.nn.Dropout.
//
// In training mode each element is kept with probability 1 - p and scaled by
// 1/(1 - p), so the expected activation is unchanged and eval mode can be the
// identity. The keep mask comes from this layer's own counter-based Generator:
// element i of a draw depends only on (seed, offset + i), so a rank and a resumed
// run reproduce the same masks given the same generator state. That state is two
// integers, exposed through generator() for checkpoints to save and restore.
// The mask is drawn in f32 whatever the input dtype, so an f64 copy of a model
// sees the same mask as the f32 one.
#pragma once

#include <cstdint>

#include "troupe/nn/module.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, std::uint64_t seed = 0);

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;

  double p() const { return p_; }
  tensor::Generator& generator() { return gen_; }
  const tensor::Generator& generator() const { return gen_; }

 protected:
  // Draws the mask alone: the input's values are not read, and the output's are unset.
  Tensor forward_for_backward_impl(const Tensor& input) override;
  void exchange_own_activations(ActivationStash& stash) override;
  tensor::Generator* forward_generator() override { return &gen_; }

 private:
  // Checks the input, and draws mask_ for its shape (undefined when not dropping).
  void draw_mask(const Tensor& input, const std::string& op);

  double p_;
  tensor::Generator gen_;
  // 0 or 1/(1-p) per element in the input's dtype; undefined when the last forward
  // was the identity (eval mode, or p = 0).
  Tensor mask_;
  bool forward_ran_ = false;
};

}  // namespace troupe::nn
