#include "troupe/parallel/tensor_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "tensor_parallel_detail.hpp"
#include "troupe/error.hpp"
#include "troupe/shard_range.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

using collectives::Buffer;
using collectives::ReduceOp;
using detail::for_each_value;
using detail::length;
using detail::require_host;

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
  require_host(dx, "ColumnParallelLinear.backward");
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

void ColumnParallelLinear::release_own_activations() {
  nn::Linear::release_own_activations();
  input_part_ = Tensor();
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
  require_host(y, "RowParallelLinear.forward");
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

Tensor VocabParallelEmbedding::forward_impl(const Tensor& ids) {
  const std::string op = type_name() + ".forward";
  TROUPE_CHECK(ids.defined() && (ids.dtype() == tensor::DType::i64 || ids.dtype() == tensor::DType::i32), op,
               ": ids must be i64 or i32");
  require_host(ids, op.c_str());
  const Tensor wide = ids.dtype() == tensor::DType::i64 ? ids : ids.to(tensor::DType::i64);
  const std::int64_t* id = wide.data<std::int64_t>();
  const std::int64_t n = wide.numel(), end = begin_ + num_embeddings();
  std::vector<std::int64_t> local(static_cast<std::size_t>(n));
  held_.assign(static_cast<std::size_t>(n), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= vocab_)
      TROUPE_THROW(InvalidArgument, op, ": index ", id[i], " at position ", i, " is out of range for a table of ",
                   vocab_, " rows");
    const bool held = id[i] >= begin_ && id[i] < end;
    held_[static_cast<std::size_t>(i)] = held;
    local[static_cast<std::size_t>(i)] = held ? id[i] - begin_ : 0;
  }
  Tensor out = nn::Embedding::forward_impl(Tensor::from_vector(local, ids.shape()));
  const std::size_t row = static_cast<std::size_t>(embedding_dim()) * tensor::element_size(out.dtype());
  auto* bytes = static_cast<std::byte*>(out.raw_data());
  for (std::int64_t i = 0; i < n; ++i)
    if (!held_[static_cast<std::size_t>(i)]) std::memset(bytes + static_cast<std::size_t>(i) * row, 0, row);
  if (sequence_parallel_) return reduce_scatter_sequence(out, *tp_);
  tp_->allreduce(Buffer(out));
  return out;
}

// Only the rows this rank looked up reach its table.
Tensor VocabParallelEmbedding::backward_impl(const Tensor& grad_output) {
  TROUPE_CHECK(!held_.empty(), type_name(), ".backward: called before forward");
  require_host(grad_output, "VocabParallelEmbedding.backward");
  // A copy either way: the rows not held are zeroed in it.
  Tensor g = sequence_parallel_ && tp_->size() > 1 ? gather_sequence(grad_output, *tp_) : grad_output.clone();
  const std::size_t row = static_cast<std::size_t>(embedding_dim()) * tensor::element_size(g.dtype());
  TROUPE_CHECK(g.nbytes() == row * held_.size(), type_name(), ".backward: grad_output ",
               tensor::to_string(grad_output.shape()), " does not match the last forward's ", held_.size(), " ids");
  auto* bytes = static_cast<std::byte*>(g.raw_data());
  for (std::size_t i = 0; i < held_.size(); ++i)
    if (!held_[i]) std::memset(bytes + i * row, 0, row);
  return nn::Embedding::backward_impl(g);
}

std::string VocabParallelEmbedding::type_name() const {
  return "VocabParallelEmbedding(" + std::to_string(vocab_) + ", " + std::to_string(embedding_dim()) + ", rows " +
         std::to_string(begin_) + "-" + std::to_string(begin_ + num_embeddings()) + ")";
}

void VocabParallelEmbedding::release_own_activations() {
  nn::Embedding::release_own_activations();
  held_.clear();
}

// ------------------------------------------------------------------ the loss

VocabParallelCrossEntropy::VocabParallelCrossEntropy(collectives::Communicator& tp, std::int64_t vocab,
                                                     std::int64_t ignore_index)
    : tp_(&tp), vocab_(vocab), ignore_index_(ignore_index) {
  std::tie(begin_, end_) = shard_range(vocab, tp.rank(), tp.size());
}

Tensor VocabParallelCrossEntropy::forward(const Tensor& logits, const Tensor& target) {
  const char* op = "VocabParallelCrossEntropy.forward";
  const std::int64_t width = end_ - begin_;
  TROUPE_CHECK(logits.defined() && logits.dim() >= 1 && logits.size(-1) == width, op,
               ": logits must end in this rank's ", width, " of ", vocab_, " classes, got ",
               logits.defined() ? tensor::to_string(logits.shape()) : "undefined");
  require_host(logits, op);
  const std::int64_t rows = logits.numel() / std::max<std::int64_t>(width, 1);
  TROUPE_CHECK(target.defined() && target.numel() == rows, op, ": ", rows, " rows of logits but ",
               target.defined() ? target.numel() : 0, " targets");
  const Tensor wide = target.dtype() == tensor::DType::i64 ? target : target.to(tensor::DType::i64);
  target_.assign(wide.data<std::int64_t>(), wide.data<std::int64_t>() + rows);
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t t = target_[static_cast<std::size_t>(i)];
    if (t != ignore_index_ && (t < 0 || t >= vocab_))
      TROUPE_THROW(InvalidArgument, op, ": target ", t, " in row ", i, " is not a class of ", vocab_,
                   " (nor ignore_index ", ignore_index_, ")");
  }
  std::vector<double> peak(static_cast<std::size_t>(rows), -std::numeric_limits<double>::infinity());
  std::vector<double> sum(static_cast<std::size_t>(rows), 0.0), picked(static_cast<std::size_t>(rows), 0.0);
  for_each_value(logits, [&](std::int64_t i, double v) {
    double& m = peak[static_cast<std::size_t>(i / width)];
    m = std::max(m, v);
  });
  tp_->allreduce(Buffer(peak), ReduceOp::max);
  for_each_value(logits, [&](std::int64_t i, double v) {
    const std::int64_t r = i / width, c = begin_ + i % width;
    sum[static_cast<std::size_t>(r)] += std::exp(v - peak[static_cast<std::size_t>(r)]);
    if (c == target_[static_cast<std::size_t>(r)]) picked[static_cast<std::size_t>(r)] = v;
  });
  tp_->allreduce(Buffer(sum));
  tp_->allreduce(Buffer(picked));
  log_sum_exp_.assign(static_cast<std::size_t>(rows), 0.0);
  double total = 0;
  counted_ = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto k = static_cast<std::size_t>(r);
    log_sum_exp_[k] = peak[k] + std::log(sum[k]);
    if (target_[k] == ignore_index_) continue;
    total += log_sum_exp_[k] - picked[k];
    ++counted_;
  }
  logits_ = logits;
  const double mean = counted_ > 0 ? total / static_cast<double>(counted_) : std::nan("");
  return Tensor::full({}, mean, logits.dtype());
}

Tensor VocabParallelCrossEntropy::backward(double scale) const {
  TROUPE_CHECK(logits_.defined(), "VocabParallelCrossEntropy.backward: called before forward");
  const std::int64_t width = end_ - begin_;
  const double factor = counted_ > 0 ? scale / static_cast<double>(counted_) : 0.0;
  Tensor grad = Tensor::empty(logits_.shape(), logits_.dtype());
  tensor::dispatch_floating(logits_.dtype(), "VocabParallelCrossEntropy.backward", [&](auto tag) {
    using T = decltype(tag);
    const T* x = logits_.data<T>();
    T* g = grad.data<T>();
    for (std::int64_t i = 0; i < logits_.numel(); ++i) {
      const auto r = static_cast<std::size_t>(i / width);
      const std::int64_t c = begin_ + i % width;
      if (target_[r] == ignore_index_) {
        g[i] = T(0);
        continue;
      }
      const double p = std::exp(static_cast<double>(static_cast<tensor::compute_t<T>>(x[i])) - log_sum_exp_[r]);
      g[i] = T(static_cast<tensor::compute_t<T>>((p - (c == target_[r] ? 1.0 : 0.0)) * factor));
    }
  });
  return grad;
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
