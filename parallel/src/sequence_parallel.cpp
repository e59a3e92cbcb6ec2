// Sequence parallelism (tensor_parallel.hpp): moving a [B, T, ...] activation between
// whole sequences and each rank's T/k positions, and switching a GPT over to it.
#include <cstring>
#include <map>
#include <string>

#include "tensor_parallel_detail.hpp"
#include "troupe/collectives/buffer.hpp"
#include "troupe/error.hpp"
#include "troupe/parallel/tensor_parallel.hpp"

namespace troupe::parallel {

using collectives::Buffer;

namespace {

void require_host(const Tensor& t, const char* op) {
  TROUPE_CHECK(t.device().is_cpu(), op, ": sequence parallelism runs on host tensors for now, got one on ", t.device());
}

// [B, t, inner] as rows: the batch, each part's positions, and the bytes of one position.
struct SequenceLayout {
  std::int64_t batch = 0, positions = 0;
  std::size_t position_bytes = 0;
};

SequenceLayout layout_of(const Tensor& t, const char* op) {
  TROUPE_CHECK(t.defined() && t.dim() >= 2, op, ": expected [B, T, ...], got ",
               t.defined() ? tensor::to_string(t.shape()) : std::string("undefined"));
  require_host(t, op);
  const std::int64_t batch = t.size(0), positions = t.size(1);
  const std::int64_t inner = batch * positions > 0 ? t.numel() / (batch * positions) : 0;
  return {batch, positions, static_cast<std::size_t>(inner) * t.element_bytes()};
}

// Copies between [B, k * t, ...] (sequences whole) and [k, B, t, ...] (rank r's block
// is its t positions of every sequence, as the collectives lay blocks out).
void regroup(const Tensor& whole, const Tensor& blocks, std::int64_t parts, const SequenceLayout& part,
             bool into_blocks) {
  auto* w = static_cast<std::byte*>(whole.raw_data());
  auto* b = static_cast<std::byte*>(blocks.raw_data());
  const std::size_t run = static_cast<std::size_t>(part.positions) * part.position_bytes;
  for (std::int64_t r = 0; r < parts; ++r)
    for (std::int64_t s = 0; s < part.batch; ++s) {
      std::byte* in_whole = w + (static_cast<std::size_t>(s * parts + r)) * run;
      std::byte* in_blocks = b + (static_cast<std::size_t>(r * part.batch + s)) * run;
      if (into_blocks)
        std::memcpy(in_blocks, in_whole, run);
      else
        std::memcpy(in_whole, in_blocks, run);
    }
}

template <class F>
void for_each_module(nn::Module& module, F&& f) {
  f(module);
  for (auto& child : module.named_children()) for_each_module(*child.module, f);
}

}  // namespace

Tensor gather_sequence(const Tensor& part, collectives::Communicator& tp) {
  const SequenceLayout layout = layout_of(part, "gather_sequence");
  const std::int64_t k = tp.size();
  if (k == 1) return part;
  tensor::Shape shape = part.shape();
  shape[1] = layout.positions * k;
  const Tensor blocks = Tensor::empty({k * part.numel()}, part.dtype());
  tp.allgather(Buffer(part), Buffer(blocks));
  Tensor whole = Tensor::empty(shape, part.dtype());
  regroup(whole, blocks, k, layout, false);
  return whole;
}

Tensor reduce_scatter_sequence(const Tensor& whole, collectives::Communicator& tp) {
  SequenceLayout layout = layout_of(whole, "reduce_scatter_sequence");
  const std::int64_t k = tp.size();
  TROUPE_CHECK(layout.positions % k == 0, "reduce_scatter_sequence: ", layout.positions,
               " positions do not split into ", k, " equal parts (sequence parallelism)");
  if (k == 1) return whole;
  layout.positions /= k;
  tensor::Shape shape = whole.shape();
  shape[1] = layout.positions;
  const Tensor blocks = Tensor::empty({whole.numel()}, whole.dtype());
  regroup(whole, blocks, k, layout, true);
  Tensor part = Tensor::empty(shape, whole.dtype());
  tp.reduce_scatter(Buffer(blocks), Buffer(part));
  return part;
}

void enable_sequence_parallel(nn::GPT& model, collectives::Communicator& tp) {
  int layers = 0;
  for_each_module(model, [&](nn::Module& m) {
    if (auto* column = dynamic_cast<ColumnParallelLinear*>(&m)) {
      column->set_sequence_parallel(true);
      ++layers;
    } else if (auto* row = dynamic_cast<RowParallelLinear*>(&m)) {
      row->set_sequence_parallel(true);
      ++layers;
    } else if (auto* embedding = dynamic_cast<VocabParallelEmbedding*>(&m)) {
      embedding->set_sequence_parallel(true);
      ++layers;
    }
  });
  TROUPE_CHECK(layers > 0, "enable_sequence_parallel: ", model.type_name(),
               " has no tensor-parallel layers (build it with tensor_parallel_gpt)");
  model.set_sequence_split(tp.size(), tp.rank());
}

// Every parameter that is not split is whole on every rank, and saw only this rank's
// positions: one all-reduce of their gradients, packed into one buffer.
void sequence_parallel_sum_gradients(nn::Module& model, collectives::Communicator& tp) {
  if (tp.size() == 1) return;
  const std::map<std::string, TensorSplit> splits = tensor_parallel_splits(model);
  std::vector<nn::Parameter*> whole;
  std::int64_t numel = 0;
  for (const auto& [name, param] : model.named_parameters()) {
    if (splits.count(name) != 0 || !param->grad.defined()) continue;
    TROUPE_CHECK(param->grad.dtype() == tensor::DType::f32, "sequence_parallel_sum_gradients: ", name,
                 "'s gradient is ", param->grad.dtype(), "; sequence parallelism runs in f32 for now");
    require_host(param->grad, "sequence_parallel_sum_gradients");
    whole.push_back(param);
    numel += param->grad.numel();
  }
  std::vector<float> packed(static_cast<std::size_t>(numel));
  std::size_t at = 0;
  for (nn::Parameter* p : whole) {
    std::memcpy(packed.data() + at, p->grad.raw_data(), p->grad.nbytes());
    at += static_cast<std::size_t>(p->grad.numel());
  }
  tp.allreduce(Buffer(packed));
  at = 0;
  for (nn::Parameter* p : whole) {
    std::memcpy(p->grad.raw_data(), packed.data() + at, p->grad.nbytes());
    at += static_cast<std::size_t>(p->grad.numel());
  }
}

}  // namespace troupe::parallel
