#include "troupe/nn/attention.hpp"

#include <memory>

#include "troupe/error.hpp"

namespace troupe::nn {

CausalSelfAttention::CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, tensor::Generator& gen,
                                         double dropout, bool bias, std::uint64_t dropout_seed, DType dtype,
                                         tensor::Device device)
    : n_embd_(n_embd), n_head_(n_head) {
  TROUPE_CHECK(n_embd > 0 && n_head > 0 && n_embd % n_head == 0, "CausalSelfAttention: n_head (", n_head,
               ") must divide n_embd (", n_embd, ")");
  c_attn_ = &register_module("c_attn", std::make_shared<Linear>(n_embd, 3 * n_embd, gen, bias, dtype, device));
  c_proj_ = &register_module("c_proj", std::make_shared<Linear>(n_embd, n_embd, gen, bias, dtype, device));
  attn_dropout_ = &register_module("attn_dropout", std::make_shared<Dropout>(dropout, dropout_seed));
  resid_dropout_ = &register_module("resid_dropout", std::make_shared<Dropout>(dropout, dropout_seed + 1));
}

CausalSelfAttention::CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head, std::shared_ptr<Linear> c_attn,
                                         std::shared_ptr<Linear> c_proj, double dropout, std::uint64_t dropout_seed)
    : n_embd_(n_embd), n_head_(n_head) {
  TROUPE_CHECK(c_attn && c_proj, "CausalSelfAttention: c_attn and c_proj must be given");
  const std::int64_t width = c_proj->in_features();
  TROUPE_CHECK(
      n_head > 0 && width % n_head == 0 && c_attn->out_features() == 3 * width && c_attn->in_features() == n_embd,
      "CausalSelfAttention: c_attn ", c_attn->type_name(), " and c_proj ", c_proj->type_name(), " do not make ", n_head,
      " heads over ", n_embd, " features");
  c_attn_ = &register_module("c_attn", std::move(c_attn));
  c_proj_ = &register_module("c_proj", std::move(c_proj));
  attn_dropout_ = &register_module("attn_dropout", std::make_shared<Dropout>(dropout, dropout_seed));
  resid_dropout_ = &register_module("resid_dropout", std::make_shared<Dropout>(dropout, dropout_seed + 1));
}

std::string CausalSelfAttention::type_name() const {
  return "CausalSelfAttention(" + std::to_string(n_embd_) + ", heads " + std::to_string(n_head_) + ")";
}

Tensor CausalSelfAttention::forward_impl(const Tensor& input) {
  TROUPE_CHECK(input.defined() && input.dim() == 3 && input.size(2) == n_embd_, type_name(),
               ".forward: input must be [B, T, ", n_embd_, "], got ",
               input.defined() ? tensor::to_string(input.shape()) : std::string("undefined"));
  qkv_ = c_attn_->forward(input);
  const double p = attn_dropout_->is_training() ? attn_dropout_->p() : 0.0;
  saved_ = tensor::causal_attention_forward(qkv_, n_head_, p, attn_dropout_->generator());
  return resid_dropout_->forward(c_proj_->forward(saved_.out));
}

Tensor CausalSelfAttention::backward_impl(const Tensor& grad_output) {
  TROUPE_CHECK(qkv_.defined(), type_name(), ".backward: called before forward");
  const Tensor gy = c_proj_->backward(resid_dropout_->backward(grad_output));
  const Tensor gqkv = tensor::causal_attention_backward(gy, qkv_, saved_, n_head_);
  return c_attn_->backward(gqkv);
}

void CausalSelfAttention::exchange_own_activations(ActivationStash& stash) {
  stash.exchange(qkv_);
  stash.exchange(saved_);
}

}  // namespace troupe::nn
