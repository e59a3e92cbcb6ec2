// CausalSelfAttention: nanoGPT's attention layer, with its names and shapes.
//
//   qkv = c_attn(x)                          Linear(C -> 3C)
//   y   = causal attention of qkv, n_head heads, attn_dropout on the weights
//   out = resid_dropout(c_proj(y))           Linear(C -> C)
//
// x is [B, T, C]. The attention itself is tensor/attention.hpp's fused forward and
// backward (no T x T matrix kept between them). attn_dropout is a Dropout child for
// its p, its mode and its Generator -- which checkpoints save with every Dropout's --
// though the kernel, not its forward, applies it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "troupe/nn/dropout.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/tensor/attention.hpp"

namespace troupe::nn {

class CausalSelfAttention : public Module {
 public:
  // Dropout seeds: attn_dropout uses `dropout_seed`, resid_dropout `dropout_seed + 1`.
  CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, tensor::Generator& gen, double dropout = 0.0,
                      bool bias = true, std::uint64_t dropout_seed = 0, DType dtype = DType::f32,
                      tensor::Device device = tensor::Device::cpu());
  // Over given projections: c_attn [..., n_embd] -> 3 x (n_head heads), c_proj back.
  // Tensor parallelism passes column- and row-parallel Linears and this rank's heads.
  CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, std::shared_ptr<Linear> c_attn,
                      std::shared_ptr<Linear> c_proj, double dropout, std::uint64_t dropout_seed);

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;

  Linear& c_attn() { return *c_attn_; }
  Linear& c_proj() { return *c_proj_; }
  std::int64_t n_head() const { return n_head_; }

 protected:
  void exchange_own_activations(ActivationStash& stash) override;

 private:
  std::int64_t n_embd_, n_head_;
  Linear* c_attn_;
  Linear* c_proj_;
  Dropout* attn_dropout_;
  Dropout* resid_dropout_;
  Tensor qkv_;
  tensor::AttentionForward saved_;
};

}  // namespace troupe::nn
