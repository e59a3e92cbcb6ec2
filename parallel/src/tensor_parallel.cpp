#include "troupe/parallel/tensor_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tensor_parallel_detail.hpp"
#include "troupe/error.hpp"
#include "troupe/shard_range.hpp"
#include "troupe/tensor/nn_ops.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

using collectives::Buffer;
using collectives::ReduceOp;
using detail::length;

namespace {

// Features of a [.., out] layer that this rank holds: its share of each of `groups` blocks.
std::int64_t column_part(std::int64_t out, std::int64_t groups, const collectives::Communicator& tp) {
  TROUPE_CHECK(groups >= 1 && out % groups == 0, "ColumnParallelLinear: ", out, " features do not split into ", groups,
               " equal groups");
  return groups * length(out / groups, tp.rank(), tp.size());
}

}  // namespace

// ----------------------------------------------------------------------- layers

ColumnParallelLinear::ColumnParallelLinear(std::int64_t in, std::int64_t out, collectives::Communicator& tp,
                                           tensor::Generator& gen, bool bias, tensor::DType dtype,
                                           tensor::Device device, std::int64_t groups)
    : nn::Linear(in, column_part(out, groups, tp), gen, bias, dtype, device),
      tp_(&tp),
      full_out_(out),
      groups_(groups) {}

ColumnParallelLinear::ColumnParallelLinear(nn::Parameter& tied_weight, std::int64_t full_out,
                                           collectives::Communicator& tp)
    : nn::Linear(tied_weight), tp_(&tp), full_out_(full_out), groups_(1) {
  TROUPE_CHECK(out_features() == length(full_out, tp.rank(), tp.size()), "ColumnParallelLinear: a tied weight of ",
               out_features(), " rows is not rank ", tp.rank(), "'s part of ", full_out);
}

Tensor ColumnParallelLinear::forward_impl(const Tensor& input) {
  if (!sequence_parallel_) return nn::Linear::forward_impl(input);
  Tensor y = nn::Linear::forward_impl(gather_sequence(input, *tp_));
  (void)take_saved_input();  // the whole sequences: gathered again in backward
  input_part_ = input;
  return y;
}

// dx = sum over ranks of gy_r W_r: each rank's part of the input gradient, all-reduced.
Tensor ColumnParallelLinear::backward_impl(const Tensor& grad_output) {
  if (sequence_parallel_) {
    TROUPE_CHECK(input_part_.defined(), type_name(), ".backward: called before forward");
    restore_saved_input(gather_sequence(input_part_, *tp_));
  }
  Tensor dx = nn::Linear::backward_impl(grad_output);
  if (sequence_parallel_) {
    (void)take_saved_input();
    return reduce_scatter_sequence(dx, *tp_);
  }
  tp_->allreduce(Buffer(dx));
  return dx;
}

Tensor ColumnParallelLinear::forward_for_backward_impl(const Tensor& input) {
  return sequence_parallel_ ? forward_impl(input) : nn::Linear::forward_for_backward_impl(input);
}

void ColumnParallelLinear::exchange_own_activations(nn::ActivationStash& stash) {
  nn::Linear::exchange_own_activations(stash);
  stash.exchange(input_part_);
}

std::string ColumnParallelLinear::type_name() const {
  return "ColumnParallelLinear(" + std::to_string(in_features()) + " -> " + std::to_string(full_out_) + ", part " +
         std::to_string(tp_->rank()) + " of " + std::to_string(tp_->size()) + ")";
}

RowParallelLinear::RowParallelLinear(std::int64_t in, std::int64_t out, collectives::Communicator& tp,
                                     tensor::Generator& gen, bool bias, tensor::DType dtype, tensor::Device device)
    : nn::Linear(length(in, tp.rank(), tp.size()), out, gen, false, dtype, device), tp_(&tp), full_in_(in) {
  if (bias) whole_bias_ = &register_parameter("bias", Tensor::zeros({out}, dtype, device));
}

// y = sum over ranks of x_r W_r^T, then the bias once.
Tensor RowParallelLinear::forward_impl(const Tensor& input) {
  Tensor y = nn::Linear::forward_impl(input);
  if (sequence_parallel_)
    y = reduce_scatter_sequence(y, *tp_);
  else
    tp_->allreduce(Buffer(y));
  if (whole_bias_) tensor::add_(y, whole_bias_->data);
  return y;
}

Tensor RowParallelLinear::forward_for_backward_impl(const Tensor& input) {
  return sequence_parallel_ ? forward_impl(input) : nn::Linear::forward_for_backward_impl(input);
}

Tensor RowParallelLinear::backward_impl(const Tensor& grad_output) {
  const std::string op = type_name() + ".backward";
  if (whole_bias_) {
    TROUPE_CHECK(grad_output.defined() && grad_output.dim() >= 1 && grad_output.size(-1) == out_features(), op,
                 ": grad_output must end in ", out_features(), " features");
    const Tensor db = tensor::sum(grad_output.reshape({grad_output.numel() / out_features(), out_features()}), 0);
    if (!whole_bias_->grad.defined())
      whole_bias_->grad = db;
    else
      tensor::add_(nn::grad_for_accumulation(*whole_bias_, op.c_str(), "bias"), db);
    grad_ready(*whole_bias_);
  }
  return nn::Linear::backward_impl(sequence_parallel_ ? gather_sequence(grad_output, *tp_) : grad_output);
}

std::string RowParallelLinear::type_name() const {
  return "RowParallelLinear(" + std::to_string(full_in_) + " -> " + std::to_string(out_features()) + ", part " +
         std::to_string(tp_->rank()) + " of " + std::to_string(tp_->size()) + ")";
}

VocabParallelEmbedding::VocabParallelEmbedding(std::int64_t vocab, std::int64_t dim, collectives::Communicator& tp,
                                               tensor::Generator& gen, tensor::DType dtype, tensor::Device device)
    : nn::Embedding(length(vocab, tp.rank(), tp.size()), dim, gen, dtype, device),
      tp_(&tp),
      vocab_(vocab),
      begin_(shard_range(vocab, tp.rank(), tp.size()).first) {}

// Ids are checked and mapped on the host (as nn::Embedding checks its own), so an error
// names the index; the lookup and the zeroing run on the table's device.
Tensor VocabParallelEmbedding::forward_impl(const Tensor& ids) {
  const std::string op = type_name() + ".forward";
  TROUPE_CHECK(ids.defined() && (ids.dtype() == tensor::DType::i64 || ids.dtype() == tensor::DType::i32), op,
               ": ids must be i64 or i32");
  const Tensor wide = ids.to(tensor::Device::cpu()).to(tensor::DType::i64);
  const std::int64_t* id = wide.data<std::int64_t>();
  const std::int64_t n = wide.numel(), end = begin_ + num_embeddings();
  std::vector<std::int64_t> local(static_cast<std::size_t>(n));
  std::vector<float> held(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= vocab_)
      TROUPE_THROW(InvalidArgument, op, ": index ", id[i], " at position ", i, " is out of range for a table of ",
                   vocab_, " rows");
    const bool mine = id[i] >= begin_ && id[i] < end;
    held[static_cast<std::size_t>(i)] = mine ? 1.0F : 0.0F;
    local[static_cast<std::size_t>(i)] = mine ? id[i] - begin_ : 0;
  }
  held_ = Tensor::from_vector(held, {n, 1}).to(weight().data.dtype()).to(weight().data.device());
  Tensor out = nn::Embedding::forward_impl(Tensor::from_vector(local, ids.shape()));
  Tensor rows = out.reshape({n, embedding_dim()});
  tensor::mul_(rows, held_);  // the rows of ids another rank holds: 0 (x 0 is -0 or 0; sums alike)
  if (sequence_parallel_) return reduce_scatter_sequence(out, *tp_);
  tp_->allreduce(Buffer(out));
  return out;
}

// Only the rows this rank looked up reach its table.
Tensor VocabParallelEmbedding::backward_impl(const Tensor& grad_output) {
  TROUPE_CHECK(held_.defined(), type_name(), ".backward: called before forward");
  // A copy either way: the rows not held are zeroed in it.
  Tensor g = sequence_parallel_ && tp_->size() > 1 ? gather_sequence(grad_output, *tp_) : grad_output.clone();
  TROUPE_CHECK(g.numel() == held_.numel() * embedding_dim(), type_name(), ".backward: grad_output ",
               tensor::to_string(grad_output.shape()), " does not match the last forward's ", held_.numel(), " ids");
  Tensor rows = g.reshape({held_.numel(), embedding_dim()});
  tensor::mul_(rows, held_);
  return nn::Embedding::backward_impl(g);
}

std::string VocabParallelEmbedding::type_name() const {
  return "VocabParallelEmbedding(" + std::to_string(vocab_) + ", " + std::to_string(embedding_dim()) + ", rows " +
         std::to_string(begin_) + "-" + std::to_string(begin_ + num_embeddings()) + ")";
}

void VocabParallelEmbedding::exchange_own_activations(nn::ActivationStash& stash) {
  nn::Embedding::exchange_own_activations(stash);
  stash.exchange(held_);
}

// ------------------------------------------------------------------ the loss

VocabParallelCrossEntropy::VocabParallelCrossEntropy(collectives::Communicator& tp, std::int64_t vocab,
                                                     std::int64_t ignore_index)
    : tp_(&tp), vocab_(vocab), ignore_index_(ignore_index) {
  std::tie(begin_, end_) = shard_range(vocab, tp.rank(), tp.size());
}

// Targets are checked on the host (they are few: one a row); the rest runs as tensor
// ops on the logits' device, in f32.
Tensor VocabParallelCrossEntropy::forward(const Tensor& logits, const Tensor& target) {
  const char* op = "VocabParallelCrossEntropy.forward";
  const std::int64_t width = end_ - begin_;
  TROUPE_CHECK(logits.defined() && logits.dim() >= 1 && logits.size(-1) == width, op,
               ": logits must end in this rank's ", width, " of ", vocab_, " classes, got ",
               logits.defined() ? tensor::to_string(logits.shape()) : "undefined");
  const std::int64_t rows = logits.numel() / std::max<std::int64_t>(width, 1);
  TROUPE_CHECK(target.defined() && target.numel() == rows, op, ": ", rows, " rows of logits but ",
               target.defined() ? target.numel() : 0, " targets");
  const Tensor wide = target.to(tensor::Device::cpu()).to(tensor::DType::i64);
  const std::int64_t* t = wide.data<std::int64_t>();
  // Per row: where its target's logit sits in the flat logits (row 0's first when this
  // rank does not hold it), whether this rank holds it, whether the row counts.
  std::vector<std::int64_t> at(static_cast<std::size_t>(rows));
  std::vector<float> held(static_cast<std::size_t>(rows)), counts(static_cast<std::size_t>(rows));
  counted_ = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto k = static_cast<std::size_t>(r);
    if (t[r] != ignore_index_ && (t[r] < 0 || t[r] >= vocab_))
      TROUPE_THROW(InvalidArgument, op, ": target ", t[r], " in row ", r, " is not a class of ", vocab_,
                   " (nor ignore_index ", ignore_index_, ")");
    const bool mine = t[r] >= begin_ && t[r] < end_;
    at[k] = mine ? r * width + t[r] - begin_ : 0;
    held[k] = mine ? 1.0F : 0.0F;
    counts[k] = t[r] == ignore_index_ ? 0.0F : 1.0F;
    counted_ += t[r] == ignore_index_ ? 0 : 1;
  }
  const tensor::Device device = logits.device();
  x_ = (logits.dtype() == tensor::DType::f32 ? logits : logits.to(tensor::DType::f32)).reshape({rows, width});
  at_ = Tensor::from_vector(at, {rows});
  held_ = Tensor::from_vector(held, {rows, 1}).to(device);
  counts_ = Tensor::from_vector(counts, {rows, 1}).to(device);
  Tensor peak = tensor::max(x_, 1, true);
  tp_->allreduce(Buffer(peak), ReduceOp::max);
  Tensor sum = tensor::sum(tensor::exp(tensor::sub(x_, peak)), 1, true);
  tp_->allreduce(Buffer(sum));
  Tensor picked = tensor::mul(tensor::gather_rows(x_.reshape({rows * width, 1}), at_), held_);
  tp_->allreduce(Buffer(picked));
  log_sum_exp_ = tensor::add(peak, tensor::log(sum));
  const double total = tensor::sum(tensor::mul(tensor::sub(log_sum_exp_, picked), counts_)).item();
  dtype_ = logits.dtype();
  shape_ = logits.shape();
  const double mean = counted_ > 0 ? total / static_cast<double>(counted_) : std::nan("");
  return Tensor::full({}, mean, logits.dtype());
}

Tensor VocabParallelCrossEntropy::backward(double scale) const {
  TROUPE_CHECK(x_.defined(), "VocabParallelCrossEntropy.backward: called before forward");
  const double factor = counted_ > 0 ? scale / static_cast<double>(counted_) : 0.0;
  // (softmax - one-hot) x factor on counted rows: the one-hot's -factor added where this
  // rank holds the target.
  Tensor grad = tensor::mul(tensor::exp(tensor::sub(x_, log_sum_exp_)), tensor::mul(counts_, factor));
  Tensor flat = grad.reshape({grad.numel(), 1});
  tensor::scatter_add_rows_(flat, at_, tensor::mul(tensor::mul(held_, counts_), -factor));
  return (dtype_ == tensor::DType::f32 ? grad : grad.to(dtype_)).reshape(shape_);
}

// ------------------------------------------------------------------ the model

nn::GPTParts tensor_parallel_parts(collectives::Communicator& tp) {
  nn::GPTParts parts;
  auto column = [&tp](std::int64_t groups) {
    return [&tp, groups](std::int64_t in, std::int64_t out, tensor::Generator& gen, bool bias, tensor::DType dtype,
                         tensor::Device device) -> std::shared_ptr<nn::Linear> {
      return std::make_shared<ColumnParallelLinear>(in, out, tp, gen, bias, dtype, device, groups);
    };
  };
  auto row = [&tp](std::int64_t in, std::int64_t out, tensor::Generator& gen, bool bias, tensor::DType dtype,
                   tensor::Device device) -> std::shared_ptr<nn::Linear> {
    return std::make_shared<RowParallelLinear>(in, out, tp, gen, bias, dtype, device);
  };
  parts.attn_c_attn = column(3);  // q, k and v split alike: this rank's heads of each
  parts.attn_c_proj = row;
  parts.mlp_c_fc = column(1);
  parts.mlp_c_proj = row;
  parts.token_embedding = [&tp](std::int64_t vocab, std::int64_t embd, tensor::Generator& gen, tensor::DType dtype,
                                tensor::Device device) -> std::shared_ptr<nn::Embedding> {
    return std::make_shared<VocabParallelEmbedding>(vocab, embd, tp, gen, dtype, device);
  };
  parts.lm_head = [&tp](nn::Parameter& tied) -> std::shared_ptr<nn::Linear> {
    const std::int64_t rows = tied.data.size(0);
    std::int64_t vocab = rows;
    tp.allreduce(Buffer(&vocab, 1));  // the parts' rows add up to the vocabulary
    return std::make_shared<ColumnParallelLinear>(tied, vocab, tp);
  };
  parts.head_parts = tp.size();
  parts.splits_logits = true;
  return parts;
}

std::unique_ptr<nn::GPT> tensor_parallel_gpt(const nn::GPTConfig& config, std::uint64_t seed,
                                             collectives::Communicator& tp) {
  TROUPE_CHECK(config.n_head % tp.size() == 0, "tensor parallelism: n_head (", config.n_head,
               ") must be a multiple of the tp size (", tp.size(), ")");
  // Each rank's attention would draw its heads' masks from the one stream the whole
  // model draws all heads' from: correlated across ranks, unlike one rank's or Megatron's.
  TROUPE_CHECK(config.dropout == 0 || tp.size() == 1, "tensor parallelism: dropout ", config.dropout,
               " is not supported yet (attention-dropout masks would repeat across the tp ranks); use 0");
  auto model =
      std::make_unique<nn::GPT>(config, seed, tensor::DType::f32, tensor::Device::cpu(), tensor_parallel_parts(tp));
  {
    const nn::GPT whole(config, seed);
    load_full_state_dict(*model, whole.state_dict(), tp);
  }
  return model;
}

}  // namespace troupe::parallel
