// GPT: a decoder-only transformer in nanoGPT's (and GPT-2's) shape and names, so a
// troupe state dict is a nanoGPT state dict and loads into the same torch.nn model.
//
//   transformer.wte          Embedding(vocab_size, n_embd), tied to lm_head.weight
//   transformer.wpe          Embedding(block_size, n_embd)
//   transformer.drop         Dropout
//   transformer.h.{i}        Block: x += attn(ln_1(x)); x += mlp(ln_2(x))
//     .ln_1, .ln_2           LayerNorm(n_embd)
//     .attn.c_attn/.c_proj   CausalSelfAttention (attention.hpp)
//     .mlp.c_fc/.c_proj      Linear(C -> 4C), GELU (tanh, as GPT-2), Linear(4C -> C), Dropout
//   transformer.ln_f         LayerNorm(n_embd)
//   lm_head                  Linear(n_embd -> vocab_size), no bias, weight = wte.weight
//
// Initialisation is GPT-2's: every Linear and Embedding weight N(0, 0.02), biases 0,
// the residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)),
// drawn in named_parameters() order from one Generator seeded with `seed`.
//
// forward(idx) takes i64 token ids [B, T] (T <= block_size) and returns logits
// [B, T, vocab_size]; backward(d logits) routes the gradient through every block in
// reverse and returns an undefined tensor (ids have no gradient). The tied table
// collects both uses -- lm_head's and wte's -- before its gradient is reported ready.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/nn/activation.hpp"
#include "troupe/nn/attention.hpp"
#include "troupe/nn/containers.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/layer_norm.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/module.hpp"

namespace troupe::nn {

// nanoGPT's GPTConfig, under its names (recorded in checkpoints as they are).
struct GPTConfig {
  std::int64_t block_size = 256;
  std::int64_t vocab_size = 65;
  std::int64_t n_layer = 6;
  std::int64_t n_head = 6;
  std::int64_t n_embd = 384;
  double dropout = 0.0;
  bool bias = true;  // in Linears and LayerNorms
};

// The layers tensor parallelism replaces (parallel/tensor_parallel.hpp). Each factory
// gets the full model's shape and returns the layer to register under nanoGPT's name;
// an unset one builds the plain nn layer. The model's parameters are then whatever
// those layers hold (a rank's shards, under tensor parallelism).
struct GPTParts {
  using LinearFactory = std::function<std::shared_ptr<Linear>(std::int64_t in, std::int64_t out, tensor::Generator&,
                                                              bool bias, DType, tensor::Device)>;
  LinearFactory attn_c_attn, attn_c_proj, mlp_c_fc, mlp_c_proj;
  std::function<std::shared_ptr<Embedding>(std::int64_t vocab, std::int64_t embd, tensor::Generator&, DType,
                                           tensor::Device)>
      token_embedding;  // transformer.wte
  std::function<std::shared_ptr<Linear>(Parameter& tied)> lm_head;
  std::int64_t head_parts = 1;                 // c_attn holds n_head / head_parts heads
  std::uint64_t attention_dropout_stream = 0;  // added to attention-dropout seeds (each part its own heads' masks)
  bool splits_logits = false;                  // lm_head returns a part of the vocabulary: no generate()
};

class MLP : public Module {
 public:
  MLP(const GPTConfig& config, tensor::Generator& gen, std::uint64_t dropout_seed, DType dtype, tensor::Device device,
      const GPTParts& parts = {});
  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override { return "MLP"; }

 protected:
  // c_proj's output is left unset: only the dropout and the block's sum read it.
  Tensor forward_for_backward_impl(const Tensor& input) override;

 private:
  Linear* c_fc_;
  GELU* gelu_;
  Linear* c_proj_;
  Dropout* dropout_;
};

class Block : public Module {
 public:
  Block(const GPTConfig& config, tensor::Generator& gen, std::uint64_t dropout_seed, DType dtype, tensor::Device device,
        const GPTParts& parts = {});
  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override { return "Block"; }
  CausalSelfAttention& attn() { return *attn_; }
  MLP& mlp() { return *mlp_; }

 protected:
  // The recompute of a checkpointed block: the output is left unset, as no backward
  // reads it (the next block keeps it as its input), so the MLP's c_proj is not run.
  Tensor forward_for_backward_impl(const Tensor& input) override;

 private:
  LayerNorm* ln_1_;
  CausalSelfAttention* attn_;
  LayerNorm* ln_2_;
  MLP* mlp_;
};

class GPT : public Module {
 public:
  // On Device::meta() the model is described, not computed: FSDP then materialises
  // each rank's shards alone, bit for bit what a CPU build would hold (tensor/meta.hpp).
  GPT(const GPTConfig& config, std::uint64_t seed, DType dtype = DType::f32,
      tensor::Device device = tensor::Device::cpu(), const GPTParts& parts = {});

  Tensor forward_impl(const Tensor& idx) override;
  Tensor backward_impl(const Tensor& grad_logits) override;
  std::string type_name() const override;

  const GPTConfig& config() const { return config_; }
  // The blocks (transformer.h), e.g. as FSDP units.
  ModuleList& blocks() { return *h_; }
  // Activation checkpointing of every `every`-th block, from block 0 (1: all, 0: none;
  // torchtitan's selective layer frequency): those blocks keep only their input through
  // the forward and recompute the rest in backward (module.hpp).
  void checkpoint_blocks(std::int64_t every);
  // Parameters without the position table, as nanoGPT reports the model's size.
  std::int64_t non_embedding_parameter_count() const;
  // Sequence parallelism (parallel/tensor_parallel.hpp): the residual stream holds
  // positions [index * T / parts, (index + 1) * T / parts) of each sequence of T tokens,
  // which the token embedding scatters and the lm_head gathers; T must divide by parts.
  void set_sequence_split(std::int64_t parts, std::int64_t index);

  // Appends `max_new_tokens` ids to `prompt`, each drawn from softmax(logits /
  // temperature) of the last position, the context cropped to block_size; eval mode
  // for the duration. temperature 0 takes the argmax.
  std::vector<std::int64_t> generate(std::vector<std::int64_t> prompt, std::int64_t max_new_tokens, double temperature,
                                     tensor::Generator& gen);

 private:
  GPTConfig config_;
  Embedding* wte_;
  Embedding* wpe_;
  Dropout* drop_;
  ModuleList* h_;
  LayerNorm* ln_f_;
  Linear* lm_head_;
  std::int64_t batch_ = 0, time_ = 0;
  bool splits_logits_ = false;
  std::int64_t sequence_parts_ = 1, sequence_index_ = 0;
};

}  // namespace troupe::nn
