// Tensor parallelism (Megatron-LM's): a layer's weight split over the ranks of a `tp`
// communicator, each holding and computing 1/k of it.
//
//   ColumnParallelLinear    output features split: y_r = x W_r^T + b_r is a part of y;
//                           backward all-reduces dx (Megatron's "f").
//   RowParallelLinear       input features split, its input a part: y = sum_r x_r W_r^T
//                           (all-reduced, Megatron's "g") + b, the bias whole.
//   VocabParallelEmbedding  table rows split by vocabulary: each rank looks up the ids it
//                           holds, zeros for the others, all-reduced.
//   VocabParallelCrossEntropy  the loss of logits split by vocabulary, no rank holding
//                           a whole row of them.
//
// tensor_parallel_parts() pairs them in a GPT: attn.c_attn column-parallel by heads
// (q, k and v split alike), attn.c_proj row-parallel; mlp.c_fc column, mlp.c_proj row;
// wte and the tied lm_head by vocabulary. A block then costs two all-reduces forward
// (the row-parallel outputs) and two backward (the column-parallel input gradients).
// Everything else (LayerNorms, wpe, the row-parallel biases) is whole on every rank and
// gets the same gradient there, since its inputs and output gradients are the same.
//
// Sequence parallelism (Megatron-LM's, enable_sequence_parallel below) splits what lies
// between those layers -- the residual stream, LayerNorms, residual adds -- over tp by
// position, so each rank holds T/k of every sequence there: each all-reduce above
// becomes a reduce-scatter over the positions, and each layer needing whole sequences
// all-gathers them (the same bytes: an all-reduce is a reduce-scatter and an
// all-gather).
//
// The model keeps nanoGPT's names; its state_dict() holds this rank's parts. Checkpoints
// stay full state dicts: full_state_dict() gathers the parts (a collective over tp) and
// load_full_state_dict() takes this rank's part of full tensors, so a TP run saves what
// a one-rank run loads, and back. Host (CPU) tensors only, for now.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/nn/state_dict.hpp"
#include "troupe/parallel/state_slices.hpp"

namespace troupe::parallel {

using tensor::Tensor;

// How a parameter is split over tp's ranks: along dimension 0 (rows; `groups` equal
// blocks split each, 3 for a fused q, k, v) or dimension 1 (columns), as shard_range
// splits a length.
struct TensorSplit {
  enum class Dim { rows, columns } dim = Dim::rows;
  std::int64_t groups = 1;
  tensor::Shape full_shape;
};

class ColumnParallelLinear : public nn::Linear {
 public:
  // This rank's part of Linear(in, out): out / groups features of each group.
  ColumnParallelLinear(std::int64_t in, std::int64_t out, collectives::Communicator& tp, tensor::Generator& gen,
                       bool bias = true, tensor::DType dtype = tensor::DType::f32,
                       tensor::Device device = tensor::Device::cpu(), std::int64_t groups = 1);
  // Tied to another layer's part of a [out, in] table (lm_head on a VocabParallelEmbedding).
  ColumnParallelLinear(nn::Parameter& tied_weight, std::int64_t full_out, collectives::Communicator& tp);

  // With sequence parallelism, all-gathers its input over the positions first, and
  // keeps only this rank's part of it for backward (Megatron's choice: one more
  // all-gather there, and 1/k of the memory).
  Tensor forward_impl(const Tensor& input) override;
  // dx summed over tp: all-reduced, or reduce-scattered over the positions.
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;
  TensorSplit split() const { return {TensorSplit::Dim::rows, groups_, {}}; }
  std::int64_t full_out_features() const { return full_out_; }
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }

 protected:
  // Linear's (input kept, no product) unless the sequence is split: then forward's.
  Tensor forward_for_backward_impl(const Tensor& input) override;
  void exchange_own_activations(nn::ActivationStash& stash) override;

 private:
  collectives::Communicator* tp_;
  std::int64_t full_out_, groups_;
  bool sequence_parallel_ = false;
  Tensor input_part_;  // sequence parallelism: this rank's positions of the last input
};

class RowParallelLinear : public nn::Linear {
 public:
  // This rank's part of Linear(in, out): a shard_range of the in features, whole bias.
  RowParallelLinear(std::int64_t in, std::int64_t out, collectives::Communicator& tp, tensor::Generator& gen,
                    bool bias = true, tensor::DType dtype = tensor::DType::f32,
                    tensor::Device device = tensor::Device::cpu());

  // The partial products summed over tp: all-reduced, or reduce-scattered over the
  // positions (sequence parallelism, whose backward then all-gathers dy).
  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;
  nn::Parameter* whole_bias() { return whole_bias_; }
  std::int64_t full_in_features() const { return full_in_; }
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }

 protected:
  // Linear's (input kept; neither product nor all-reduce: every rank of tp skips both)
  // unless the sequence is split: then forward's.
  Tensor forward_for_backward_impl(const Tensor& input) override;

 private:
  collectives::Communicator* tp_;
  std::int64_t full_in_;
  nn::Parameter* whole_bias_ = nullptr;
  bool sequence_parallel_ = false;
};

class VocabParallelEmbedding : public nn::Embedding {
 public:
  VocabParallelEmbedding(std::int64_t vocab, std::int64_t dim, collectives::Communicator& tp, tensor::Generator& gen,
                         tensor::DType dtype = tensor::DType::f32, tensor::Device device = tensor::Device::cpu());

  Tensor forward_impl(const Tensor& ids) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;
  std::int64_t vocab_begin() const { return begin_; }
  std::int64_t full_vocab() const { return vocab_; }
  // Rows [B, T, C] reduce-scattered over the positions instead of all-reduced.
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }

 protected:
  void exchange_own_activations(nn::ActivationStash& stash) override;

 private:
  collectives::Communicator* tp_;
  std::int64_t vocab_, begin_;
  Tensor held_;  // [ids, 1] of the last forward: 1 where this rank holds the id's row
  bool sequence_parallel_ = false;
};

// Cross-entropy over the vocabulary (mean over rows, as nn::CrossEntropyLoss) of logits
// [..., V_r] that are this rank's shard_range of a vocabulary of `vocab`: per row, the
// maximum, the sum of exponentials and the target's logit are all-reduced over tp
// (three all-reduces of one f32 per row), never the logits. On the logits' device.
class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(collectives::Communicator& tp, std::int64_t vocab, std::int64_t ignore_index = -100);

  // target: i64 ids [...] over the whole vocabulary. Returns the 0-dim loss, the same
  // on every rank, in the logits' dtype.
  Tensor forward(const Tensor& logits, const Tensor& target);
  // d loss / d (this rank's logits), times `scale`.
  Tensor backward(double scale = 1.0) const;

 private:
  collectives::Communicator* tp_;
  std::int64_t vocab_, begin_, end_, ignore_index_;
  // Of the last forward: the logits [rows, V_r] in f32, and per row the log-sum-exp,
  // its target's flat index here (host), whether this rank holds it, whether it counts.
  Tensor x_, log_sum_exp_, at_, held_, counts_;
  tensor::Shape shape_;
  tensor::DType dtype_ = tensor::DType::f32;
  std::int64_t counted_ = 0;
};

// The layers above in a GPT's places (nn::GPTParts); n_head must be a multiple of tp's size.
nn::GPTParts tensor_parallel_parts(collectives::Communicator& tp);

// This rank's part of the GPT that nn::GPT(config, seed) builds on one rank: that model's
// initialisation, split (the whole model is built on each rank first, then dropped).
// Dropout must be 0 at tp > 1: each rank's attention would draw its heads' masks from
// the stream one rank draws all heads' from, so they would repeat across ranks.
std::unique_ptr<nn::GPT> tensor_parallel_gpt(const nn::GPTConfig& config, std::uint64_t seed,
                                             collectives::Communicator& tp);

// Sequence parallelism for a GPT of tensor_parallel_gpt(..., tp): its tp layers switch
// to gathering and reduce-scattering over the positions (above), and the model's
// residual stream holds this rank's T/k of them (nn::GPT::set_sequence_split). Each rank
// keeps 1/k of the activations between the tp layers. The whole parameters
// (LayerNorms, wpe, row-parallel biases) then see T/k positions on each rank: after a
// backward, sequence_parallel_sum_gradients() adds their gradients over tp. Sequences
// must split into k equal parts.
void enable_sequence_parallel(nn::GPT& model, collectives::Communicator& tp);
void sequence_parallel_sum_gradients(nn::Module& model, collectives::Communicator& tp);
// [B, T/k, ...] parts of `tp`'s ranks, rank r's at positions [r T/k, (r+1) T/k), into
// the whole [B, T, ...] on every rank; and partial sums [B, T, ...] on every rank into
// this rank's positions of their sum. Host tensors; collectives over tp.
Tensor gather_sequence(const Tensor& part, collectives::Communicator& tp);
Tensor reduce_scatter_sequence(const Tensor& whole, collectives::Communicator& tp);

// Every split parameter of `model` by its full name (shared ones under each name).
std::map<std::string, TensorSplit> tensor_parallel_splits(nn::Module& model);

// The full tensors of `model`'s state dict, gathered over tp (every rank gets them).
nn::StateDict full_state_dict(nn::Module& model, collectives::Communicator& tp);
// Loads this rank's parts of `full` (a state dict of the whole model, e.g. a one-rank
// checkpoint) into `model`: shapes are checked against the split model's.
void load_full_state_dict(nn::Module& model, const nn::StateDict& full, collectives::Communicator& tp);

// The gradient norm of the whole model (split parameters' squares summed over tp, whole
// ones counted once), and clip_grad_norm over it: every rank scales alike.
double tensor_parallel_grad_norm(nn::Module& model, collectives::Communicator& tp);
double tensor_parallel_clip_grad_norm(nn::Module& model, double max_norm, collectives::Communicator& tp);

// A model's state dict of parts with every split entry gathered into the full tensor
// (a collective over tp), and the reverse: this rank's parts of a full one (shapes
// checked). For a model whose parameters are not the module's own between uses (FSDP's).
nn::StateDict full_model_state_dict(const nn::StateDict& parts, const std::map<std::string, TensorSplit>& splits,
                                    collectives::Communicator& tp);
nn::StateDict model_state_dict_part(const nn::StateDict& full, const std::map<std::string, TensorSplit>& splits,
                                    const collectives::Communicator& tp);

// An optimizer's state dict ("<param>/<slot>" keys) with every slot shaped like its
// split parameter's part gathered into the full tensor (a collective over tp), and the
// reverse: this rank's parts of a full one. Other entries pass through.
nn::StateDict full_optimizer_state_dict(const nn::StateDict& parts, const std::map<std::string, TensorSplit>& splits,
                                        collectives::Communicator& tp);
nn::StateDict optimizer_state_dict_part(const nn::StateDict& full, const std::map<std::string, TensorSplit>& splits,
                                        const collectives::Communicator& tp);

class DistributedDataParallel;

// A split model's state as checkpoints keep it: the model and optimizer groups full,
// gathered over tp (an optimizer slot of a split parameter's shape is split as the
// parameter is), and loaded by taking this rank's parts, so a file of one layout (or
// of one rank) resumes in any other. DDP over the dp ranks keeps the micro-step.
// Gathering is a collective over tp; loading is not.
class TensorParallelStateDicts final : public ShardedStateDicts {
 public:
  TensorParallelStateDicts(nn::Module& model, nn::Optimizer& optimizer, DistributedDataParallel& ddp,
                           collectives::Communicator& tp);

  nn::StateDict model_state_dict() override;
  nn::StateDict optimizer_state_dict() override;
  void load_model_state_dict(const nn::StateDict& dict) override;
  void load_optimizer_state_dict(const nn::StateDict& dict) override;
  std::int64_t micro_step() const override;
  void set_micro_step(std::int64_t step) override;

 private:
  nn::Module& model_;
  nn::Optimizer& optimizer_;
  DistributedDataParallel& ddp_;
  collectives::Communicator& tp_;
  std::map<std::string, TensorSplit> splits_;
};

}  // namespace troupe::parallel
