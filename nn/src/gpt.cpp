#include "troupe/nn/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::nn {

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

namespace {

std::shared_ptr<Linear> make_linear(const GPTParts::LinearFactory& factory, std::int64_t in, std::int64_t out,
                                    tensor::Generator& gen, bool bias, DType dtype, tensor::Device device) {
  if (factory) return factory(in, out, gen, bias, dtype, device);
  return std::make_shared<Linear>(in, out, gen, bias, dtype, device);
}

}  // namespace

MLP::MLP(const GPTConfig& c, tensor::Generator& gen, std::uint64_t dropout_seed, DType dtype, tensor::Device device,
         const GPTParts& parts) {
  c_fc_ = &register_module("c_fc", make_linear(parts.mlp_c_fc, c.n_embd, 4 * c.n_embd, gen, c.bias, dtype, device));
  gelu_ = &register_module("gelu", std::make_shared<GELU>(GeluApproximate::tanh));
  c_proj_ =
      &register_module("c_proj", make_linear(parts.mlp_c_proj, 4 * c.n_embd, c.n_embd, gen, c.bias, dtype, device));
  dropout_ = &register_module("dropout", std::make_shared<Dropout>(c.dropout, dropout_seed));
}

Tensor MLP::forward_impl(const Tensor& input) {
  return dropout_->forward(c_proj_->forward(gelu_->forward(c_fc_->forward(input))));
}

Tensor MLP::forward_for_backward_impl(const Tensor& input) {
  return dropout_->forward_for_backward(c_proj_->forward_for_backward(gelu_->forward(c_fc_->forward(input))));
}

Tensor MLP::backward_impl(const Tensor& grad_output) {
  return c_fc_->backward(gelu_->backward(c_proj_->backward(dropout_->backward(grad_output))));
}

Block::Block(const GPTConfig& c, tensor::Generator& gen, std::uint64_t dropout_seed, DType dtype, tensor::Device device,
             const GPTParts& parts) {
  ln_1_ = &register_module("ln_1", std::make_shared<LayerNorm>(c.n_embd, 1e-5, true, dtype, device));
  TROUPE_CHECK(parts.head_parts >= 1 && c.n_head % parts.head_parts == 0, "GPT: n_head (", c.n_head,
               ") must be a multiple of the attention's parts (", parts.head_parts, ")");
  auto c_attn = make_linear(parts.attn_c_attn, c.n_embd, 3 * c.n_embd, gen, c.bias, dtype, device);
  auto c_proj = make_linear(parts.attn_c_proj, c.n_embd, c.n_embd, gen, c.bias, dtype, device);
  attn_ = &register_module("attn", std::make_shared<CausalSelfAttention>(
                                       c.n_embd, c.n_head / parts.head_parts, std::move(c_attn), std::move(c_proj),
                                       c.dropout, dropout_seed + parts.attention_dropout_stream));
  ln_2_ = &register_module("ln_2", std::make_shared<LayerNorm>(c.n_embd, 1e-5, true, dtype, device));
  mlp_ = &register_module("mlp", std::make_shared<MLP>(c, gen, dropout_seed + 2, dtype, device, parts));
}

// Out of place: ln_2 keeps a handle to x for its backward.
Tensor Block::forward_impl(const Tensor& input) {
  const Tensor x = tensor::add(input, attn_->forward(ln_1_->forward(input)));
  return tensor::add(x, mlp_->forward(ln_2_->forward(x)));
}

Tensor Block::forward_for_backward_impl(const Tensor& input) {
  const Tensor x = tensor::add(input, attn_->forward(ln_1_->forward(input)));
  return mlp_->forward_for_backward(ln_2_->forward(x));
}

// The residual's gradient passes through unchanged and adds to each branch's. Out of
// place: a deferred weight gradient (weight_gradients.hpp) still reads what the branch
// was given.
Tensor Block::backward_impl(const Tensor& grad_output) {
  const Tensor g = tensor::add(grad_output, ln_2_->backward(mlp_->backward(grad_output)));
  return tensor::add(g, ln_1_->backward(attn_->backward(g)));
}

GPT::GPT(const GPTConfig& c, std::uint64_t seed, DType dtype, tensor::Device device, const GPTParts& parts)
    : config_(c), splits_logits_(parts.splits_logits) {
  TROUPE_CHECK(c.block_size > 0 && c.vocab_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
               "GPT: block_size, vocab_size, n_layer, n_head and n_embd must be > 0");
  TROUPE_CHECK(c.n_embd % c.n_head == 0, "GPT: n_head (", c.n_head, ") must divide n_embd (", c.n_embd, ")");
  TROUPE_CHECK(c.dropout >= 0 && c.dropout < 1, "GPT: dropout must be in [0, 1), got ", c.dropout);
  tensor::Generator gen(seed);
  // Each Dropout its own stream: 3 per block, then transformer.drop.
  std::uint64_t dropout_seed = seed * 1000003 + 17;
  auto& transformer = register_module("transformer", std::make_shared<ModuleDict>());
  wte_ = &transformer.add("wte", parts.token_embedding
                                     ? parts.token_embedding(c.vocab_size, c.n_embd, gen, dtype, device)
                                     : std::make_shared<Embedding>(c.vocab_size, c.n_embd, gen, dtype, device));
  wpe_ = &transformer.add("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd, gen, dtype, device));
  drop_ = &transformer.add("drop", std::make_shared<Dropout>(c.dropout, dropout_seed++));
  h_ = &transformer.add("h", std::make_shared<ModuleList>());
  for (std::int64_t i = 0; i < c.n_layer; ++i, dropout_seed += 3)
    h_->add(std::make_shared<Block>(c, gen, dropout_seed, dtype, device, parts));
  ln_f_ = &transformer.add("ln_f", std::make_shared<LayerNorm>(c.n_embd, 1e-5, true, dtype, device));
  lm_head_ = &register_module("lm_head",
                              parts.lm_head ? parts.lm_head(wte_->weight()) : std::make_shared<Linear>(wte_->weight()));

  // GPT-2's initialisation, over the constructors' draws.
  tensor::Generator init(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (auto& [name, param] : named_parameters()) {
    if (name.find(".ln_") != std::string::npos) continue;  // LayerNorms keep ones and zeros
    if (ends_with(name, ".bias")) {
      param->data.zero_();
    } else if (ends_with(name, "c_proj.weight")) {
      tensor::normal_(param->data, 0.0, residual_std, init);
    } else {
      tensor::normal_(param->data, 0.0, 0.02, init);
    }
  }
}

std::string GPT::type_name() const {
  return "GPT(layers " + std::to_string(config_.n_layer) + ", heads " + std::to_string(config_.n_head) + ", embd " +
         std::to_string(config_.n_embd) + ")";
}

std::int64_t GPT::non_embedding_parameter_count() const {
  return parameter_count() - wpe_->num_embeddings() * wpe_->embedding_dim();
}

Tensor GPT::forward_impl(const Tensor& idx) {
  TROUPE_CHECK(idx.defined() && idx.dim() == 2, type_name(), ".forward: token ids must be [B, T], got ",
               idx.defined() ? tensor::to_string(idx.shape()) : std::string("undefined"));
  batch_ = idx.size(0);
  time_ = idx.size(1);
  TROUPE_CHECK(time_ >= 1 && time_ <= config_.block_size, type_name(), ".forward: a sequence of ", time_,
               " tokens does not fit block_size ", config_.block_size);
  TROUPE_CHECK(time_ % sequence_parts_ == 0, type_name(), ".forward: a sequence of ", time_,
               " tokens does not split into ", sequence_parts_, " equal parts (sequence parallelism)");
  const std::int64_t part = time_ / sequence_parts_, first = sequence_index_ * part;
  const Tensor positions = Tensor::arange(static_cast<double>(first), static_cast<double>(first + part), 1, DType::i64);
  Tensor x = tensor::add(wte_->forward(idx), wpe_->forward(positions));
  x = drop_->forward(x);
  for (std::size_t i = 0; i < h_->size(); ++i) x = (*h_)[i].forward(x);
  return lm_head_->forward(ln_f_->forward(x));
}

Tensor GPT::backward_impl(const Tensor& grad_logits) {
  TROUPE_CHECK(batch_ > 0, type_name(), ".backward: called before forward");
  Tensor g = ln_f_->backward(lm_head_->backward(grad_logits));
  for (std::size_t i = h_->size(); i-- > 0;) g = (*h_)[i].backward(g);
  g = drop_->backward(g);
  wpe_->backward(tensor::sum(g, 0));
  wte_->backward(g);
  return Tensor();
}

void GPT::set_sequence_split(std::int64_t parts, std::int64_t index) {
  TROUPE_CHECK(parts >= 1 && index >= 0 && index < parts, type_name(), ".set_sequence_split: part ", index, " of ",
               parts, " does not exist");
  sequence_parts_ = parts;
  sequence_index_ = index;
}

void GPT::checkpoint_blocks(std::int64_t every) {
  TROUPE_CHECK(every >= 0, type_name(), ".checkpoint_blocks: every must be >= 0, got ", every);
  for (std::size_t i = 0; i < h_->size(); ++i)
    (*h_)[i].set_activation_checkpointing(every > 0 && static_cast<std::int64_t>(i) % every == 0);
}

std::vector<std::int64_t> GPT::generate(std::vector<std::int64_t> ids, std::int64_t max_new_tokens, double temperature,
                                        tensor::Generator& gen) {
  TROUPE_CHECK(!ids.empty(), type_name(), ".generate: the prompt is empty");
  TROUPE_CHECK(!splits_logits_, type_name(), ".generate: this model's logits are a part of the vocabulary ",
               "(tensor parallelism); generate with the full model");
  TROUPE_CHECK(temperature >= 0, type_name(), ".generate: temperature must be >= 0, got ", temperature);
  const bool was_training = is_training();
  eval();
  for (std::int64_t n = 0; n < max_new_tokens; ++n) {
    const auto t = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), config_.block_size);
    const std::vector<std::int64_t> context(ids.end() - t, ids.end());
    Tensor logits = forward(Tensor::from_vector(context, {1, t}));
    if (logits.device().is_cuda()) logits = logits.to(tensor::Device::cpu());
    const std::vector<double> last =
        logits.to(DType::f64).reshape({t, config_.vocab_size}).select(t - 1).to_vector<double>();
    std::int64_t next = 0;
    if (temperature == 0) {
      next = std::max_element(last.begin(), last.end()) - last.begin();
    } else {
      const double top = *std::max_element(last.begin(), last.end());
      std::vector<double> weights(last.size());
      double total = 0;
      for (std::size_t v = 0; v < last.size(); ++v) total += weights[v] = std::exp((last[v] - top) / temperature);
      double u = tensor::uniform({1}, 0.0, 1.0, gen, DType::f64).item() * total;
      next = static_cast<std::int64_t>(weights.size()) - 1;
      for (std::size_t v = 0; v < weights.size(); ++v) {
        if (u < weights[v]) {
          next = static_cast<std::int64_t>(v);
          break;
        }
        u -= weights[v];
      }
    }
    ids.push_back(next);
  }
  train(was_training);
  return ids;
}

}  // namespace troupe::nn
