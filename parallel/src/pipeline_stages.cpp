// The GPT cut into pipeline stages (GptStage), a rank's interleaved stages
// (InterleavedStage), and clipping over every stage (pipeline.hpp).
#include "troupe/parallel/pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "tensor_parallel_detail.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/containers.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

using collectives::Buffer;

namespace {

// Beside the schedule's tags (pipeline.cpp), on the pp communicator.
constexpr int kTiedGradient = 103;
constexpr int kTiedTable = 104;

template <class M>
M* as(const std::shared_ptr<nn::Module>& module, const char* what) {
  auto* typed = dynamic_cast<M*>(module.get());
  TROUPE_CHECK(typed != nullptr, "GptStage: the GPT has no ", what);
  return typed;
}

}  // namespace

// ------------------------------------------------------------------ the GPT's stages

GptStage::GptStage(const nn::GPTConfig& config, std::uint64_t seed, int stage, int stages,
                   collectives::Communicator* tp, PipelineCut cut)
    : stage_(stage), stages_(stages) {
  TROUPE_CHECK(stages >= 1 && stage >= 0 && stage < stages, "GptStage: stage ", stage, " of ", stages);
  TROUPE_CHECK(config.n_layer >= stages, "GptStage: ", config.n_layer, " blocks do not fill ", stages,
               " pipeline stages");
  const std::vector<std::int64_t> bounds = gpt_pipeline_cut(config, stages, cut);
  begin_ = bounds[static_cast<std::size_t>(stage)];
  end_ = bounds[static_cast<std::size_t>(stage) + 1];
  const std::unique_ptr<nn::GPT> model =
      tp != nullptr ? tensor_parallel_gpt(config, seed, *tp) : std::make_unique<nn::GPT>(config, seed);
  const nn::GPT& whole = *model;
  const auto transformer = whole.shared_child("transformer");
  TROUPE_CHECK(transformer != nullptr, "GptStage: the GPT has no transformer");
  auto& mine = register_module("transformer", std::make_shared<nn::ModuleDict>());
  if (first()) {
    wte_ = &mine.add("wte", std::dynamic_pointer_cast<nn::Embedding>(transformer->shared_child("wte")));
    wpe_ = &mine.add("wpe", std::dynamic_pointer_cast<nn::Embedding>(transformer->shared_child("wpe")));
    drop_ = &mine.add("drop", transformer->shared_child("drop"));
  }
  const auto blocks = transformer->shared_child("h");
  auto& h = mine.add("h", std::make_shared<nn::ModuleDict>());
  for (std::int64_t i = begin_; i < end_; ++i)
    blocks_.push_back(&h.add(std::to_string(i), blocks->shared_child(std::to_string(i))));
  if (last()) {
    ln_f_ = &mine.add("ln_f", transformer->shared_child("ln_f"));
    lm_head_ = &register_module("lm_head", whole.shared_child("lm_head"));
  }
  // The tied table: wte's on the first stage, lm_head's (wte's, kept alive) on the last.
  auto table = transformer->shared_child("wte");
  tied_ = &as<nn::Embedding>(table, "wte")->weight();
  if (last() && !first()) table_owner_ = table;
  // Uses in this stage: both on a single stage, one on the first or the last.
  tied_->uses = first() && last() ? 2 : 1;
}

std::string GptStage::type_name() const {
  return "GptStage(" + std::to_string(stage_) + " of " + std::to_string(stages_) + ", blocks " +
         std::to_string(begin_) + "-" + std::to_string(end_) + ")";
}

Tensor GptStage::forward_impl(const Tensor& input) {
  Tensor x = input;
  if (first()) {
    TROUPE_CHECK(input.defined() && input.dim() == 2, type_name(), ".forward: token ids must be [B, T]");
    const Tensor positions = Tensor::arange(0, static_cast<double>(input.size(1)), 1, tensor::DType::i64);
    x = drop_->forward(tensor::add(wte_->forward(input), wpe_->forward(positions)));
  }
  for (nn::Module* block : blocks_) x = block->forward(x);
  if (last()) x = lm_head_->forward(ln_f_->forward(x));
  return x;
}

Tensor GptStage::backward_impl(const Tensor& grad_output) {
  Tensor g = grad_output;
  if (last()) g = ln_f_->backward(lm_head_->backward(g));
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) g = (*it)->backward(g);
  if (!first()) return g;
  g = drop_->backward(g);
  wpe_->backward(tensor::sum(g, 0));
  wte_->backward(g);
  return Tensor();
}

void GptStage::reduce_tied_gradient(collectives::Communicator& pp) {
  if (stages_ == 1 || !(first() || last())) return;
  TROUPE_CHECK(tied_->grad.defined(), type_name(), ".reduce_tied_gradient: the tied table has no gradient");
  if (first()) {
    pp.send(Buffer(tied_->grad), (stages_ - 1) % pp.size(), kTiedGradient);
    tied_->grad = Tensor();  // the last stage steps the sum
    return;
  }
  Tensor theirs = Tensor::empty(tied_->grad.shape(), tied_->grad.dtype(), tied_->grad.device());
  pp.recv(Buffer(theirs), 0, kTiedGradient);
  tensor::add_(tied_->grad, theirs);
}

void GptStage::broadcast_tied_table(collectives::Communicator& pp) {
  if (stages_ == 1 || !(first() || last())) return;
  if (last())
    pp.send(Buffer(tied_->data), 0, kTiedTable);
  else
    pp.recv(Buffer(tied_->data), (stages_ - 1) % pp.size(), kTiedTable);
}

void GptStage::checkpoint_blocks(std::int64_t every) {
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->set_activation_checkpointing(every > 0 && (begin_ + static_cast<std::int64_t>(i)) % every == 0);
}

// ------------------------------------------------------------ interleaved stages

namespace {

bool is_dict(const std::shared_ptr<nn::Module>& module) {
  return dynamic_cast<nn::ModuleDict*>(module.get()) != nullptr;
}

// Adds `from`'s children to a tree of the InterleavedStage's own, of which `into` is a
// node and `add` registers a child there: the layers shared, a dict both hold (a GPT's
// "transformer", its "h") merged one level down.
using AddChild = std::function<nn::Module&(const std::string&, std::shared_ptr<nn::Module>)>;
void merge_tree(const nn::Module& into, const AddChild& add, const nn::Module& from, const std::string& path) {
  for (const std::string& name : from.child_names()) {
    const auto child = from.shared_child(name);
    const auto held = into.shared_child(name);
    TROUPE_CHECK(held == nullptr || (is_dict(held) && is_dict(child)), "InterleavedStage: two chunks hold '", path,
                 name, "'");
    if (!is_dict(child)) {
      add(name, child);
      continue;
    }
    auto& dict = static_cast<nn::ModuleDict&>(held ? *held : add(name, std::make_shared<nn::ModuleDict>()));
    merge_tree(
        dict, [&dict](const std::string& n, std::shared_ptr<nn::Module> c) -> nn::Module& { return dict.add(n, c); },
        *child, path + name + ".");
  }
}

}  // namespace

InterleavedStage::InterleavedStage(std::vector<std::unique_ptr<PipelineStage>> chunks) : chunks_(std::move(chunks)) {
  TROUPE_CHECK(chunks_.size() >= 2, "InterleavedStage: two or more chunks, got ", chunks_.size());
  for (const auto& chunk : chunks_) {
    TROUPE_CHECK(chunk != nullptr, "InterleavedStage: a null chunk");
    for (const auto& [name, param] : chunk->named_parameters())
      TROUPE_CHECK(name.find('.') != std::string::npos, "InterleavedStage: ", chunk->type_name(), " holds parameter '",
                   name, "' itself, not in a child");
    merge_tree(
        *this,
        [this](const std::string& n, std::shared_ptr<nn::Module> c) -> nn::Module& {
          return register_module(n, std::move(c));
        },
        *chunk, "");
  }
}

Tensor InterleavedStage::forward_impl(const Tensor&) {
  TROUPE_THROW(InvalidArgument, type_name(), ": its chunks run through a Pipeline (interleaved schedule), ",
               "not forward()");
}

Tensor InterleavedStage::backward_impl(const Tensor&) {
  TROUPE_THROW(InvalidArgument, type_name(), ": its chunks run through a Pipeline (interleaved schedule), ",
               "not backward()");
}

std::string InterleavedStage::type_name() const {
  std::string name = "InterleavedStage(";
  for (std::size_t c = 0; c < chunks_.size(); ++c) name += (c ? ", " : "") + chunks_[c]->type_name();
  return name + ")";
}

void InterleavedStage::reduce_tied_gradient(collectives::Communicator& pp) {
  for (const auto& chunk : chunks_) chunk->reduce_tied_gradient(pp);
}

void InterleavedStage::broadcast_tied_table(collectives::Communicator& pp) {
  for (const auto& chunk : chunks_) chunk->broadcast_tied_table(pp);
}

const nn::Parameter* InterleavedStage::tied_copy() const {
  for (const auto& chunk : chunks_)
    if (const nn::Parameter* copy = chunk->tied_copy()) return copy;
  return nullptr;
}

const nn::Parameter* InterleavedStage::tied_unowned() const {
  for (const auto& chunk : chunks_)
    if (const nn::Parameter* table = chunk->tied_unowned()) return table;
  return nullptr;
}

std::vector<PipelineStage*> InterleavedStage::chunks() {
  std::vector<PipelineStage*> out;
  for (const auto& chunk : chunks_) out.push_back(chunk.get());
  return out;
}

double pipeline_clip_grad_norm(PipelineStage& stage, double max_norm, collectives::Communicator& pp,
                               collectives::Communicator* tp) {
  const auto splits = tp != nullptr ? tensor_parallel_splits(stage) : std::map<std::string, TensorSplit>{};
  double split = 0, whole = 0;
  for (const auto& [name, param] : stage.named_parameters())
    if (param->grad.defined()) (splits.count(name) ? split : whole) += detail::sum_of_squares(param->grad);
  if (tp != nullptr) tp->allreduce(Buffer(&split, 1));
  double sum = split + whole;  // the same on every rank of a tp group: its whole gradients are equal
  pp.allreduce(Buffer(&sum, 1));
  const double total = std::sqrt(sum);
  const double factor = max_norm / (total + 1e-6);  // torch's clip_grad_norm_
  if (!std::isfinite(total) || factor >= 1.0) return total;
  for (nn::Parameter* p : stage.parameters())
    if (p->grad.defined()) tensor::scale_(p->grad, factor);
  return total;
}

}  // namespace troupe::parallel
