#include "troupe/parallel/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "troupe/error.hpp"
#include "troupe/nn/containers.hpp"
#include "troupe/shard_range.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

using collectives::Buffer;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kActivation = 101;
constexpr int kGradient = 102;
constexpr int kTied = 103;
constexpr std::size_t kMaxDims = 6;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

template <class M>
M* as(const std::shared_ptr<nn::Module>& module, const char* what) {
  auto* typed = dynamic_cast<M*>(module.get());
  TROUPE_CHECK(typed != nullptr, "GptStage: the GPT has no ", what);
  return typed;
}

double squares(const Tensor& g) {
  double sum = 0;
  tensor::dispatch_floating(g.dtype(), "pipeline_clip_grad_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* p = g.data<T>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      const double v = static_cast<double>(static_cast<tensor::compute_t<T>>(p[i]));
      sum += v * v;
    }
  });
  return sum;
}

}  // namespace

PipelineSchedule parse_pipeline_schedule(std::string_view name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  TROUPE_THROW(InvalidArgument, "unknown pipeline schedule '", name, "': gpipe or 1f1b");
}

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b";
}

// ------------------------------------------------------------------ the schedule

Pipeline::Pipeline(nn::Module& stage, collectives::Communicator& pp, PipelineSchedule schedule, int micro_batches)
    : stage_(stage), pp_(pp), schedule_(schedule), micro_batches_(micro_batches) {
  TROUPE_CHECK(micro_batches >= 1, "Pipeline: micro_batches must be >= 1, got ", micro_batches);
  stage_.set_activation_checkpointing(true);
  if (pp.size() > 1) {
    activations_ = pp.split(0, pp.rank());
    gradients_ = pp.split(0, pp.rank());
  }
}

// An activation goes as a header (dtype, rank, dims) then the data, in order on one tag;
// its gradient comes back without one, shaped as the activation that was sent. So a
// receive waits for one message before it knows what to post, never two in a row.
void Pipeline::send(collectives::Communicator& comm, const Tensor& t, int peer, bool header) {
  const Tensor data = t.device().is_cpu() ? t : t.to(tensor::Device::cpu());
  if (header) {
    TROUPE_CHECK(static_cast<std::size_t>(t.dim()) <= kMaxDims, "Pipeline: a ", t.dim(), "-dim tensor between stages");
    Tensor head = Tensor::zeros({static_cast<std::int64_t>(kMaxDims + 2)}, tensor::DType::i64);
    auto* h = head.data<std::int64_t>();
    h[0] = static_cast<std::int64_t>(t.dtype());
    h[1] = t.dim();
    for (std::int64_t d = 0; d < t.dim(); ++d) h[2 + d] = t.size(d);
    sends_.push_back(comm.send_async(Buffer(head), peer, kActivation));
    sending_.push_back(head);
  }
  sends_.push_back(comm.send_async(Buffer(data), peer, header ? kActivation : kGradient));
  sending_.push_back(data);
}

Tensor Pipeline::receive(collectives::Communicator& comm, int peer) {
  Tensor head = Tensor::zeros({static_cast<std::int64_t>(kMaxDims + 2)}, tensor::DType::i64);
  comm.recv(Buffer(head), peer, kActivation);
  const auto* h = head.data<std::int64_t>();
  TROUPE_CHECK(h[1] >= 0 && h[1] <= static_cast<std::int64_t>(kMaxDims) && h[0] >= 0 && h[0] <= 6,
               "Pipeline: a malformed header from stage ", peer);
  tensor::Shape shape;
  for (std::int64_t d = 0; d < h[1]; ++d) shape.push_back(h[2 + d]);
  Tensor t = Tensor::empty(shape, static_cast<tensor::DType>(h[0]));
  comm.recv(Buffer(t), peer, kActivation);
  return t;
}

Tensor Pipeline::receive_like(collectives::Communicator& comm, const std::pair<tensor::Shape, tensor::DType>& like,
                              int peer) {
  Tensor t = Tensor::empty(like.first, like.second);
  comm.recv(Buffer(t), peer, kGradient);
  return t;
}

void Pipeline::set_tracer(Tracer* tracer) {
  tracer_ = tracer;
  activations_->set_tracer(tracer, "pp activations");
  gradients_->set_tracer(tracer, "pp gradients");
}

std::chrono::nanoseconds Pipeline::wait_time() const { return activations_->wait_time() + gradients_->wait_time(); }

void Pipeline::finish_sends() {
  for (auto& work : sends_) work.wait();
  sends_.clear();
  sending_.clear();
}

double Pipeline::forward_backward(const Tensor& inputs, const Tensor& targets, const PipelineLoss& loss) {
  const int s = pp_.rank(), p = pp_.size(), m = micro_batches_;
  const bool first = s == 0, last = s == p - 1;
  const Tensor& split = first ? inputs : targets;
  if (first || last) {
    TROUPE_CHECK(split.defined() && split.dim() >= 1 && split.size(0) % m == 0, "Pipeline: a batch of ",
                 split.defined() ? split.size(0) : 0, " does not split into ", m, " micro-batches");
  }
  TROUPE_CHECK(!last || (loss.forward && loss.backward), "Pipeline: the last stage needs the loss");
  const std::int64_t rows = (first || last) ? split.size(0) / m : 0;
  const auto start = Clock::now();
  double busy = 0, loss_sum = 0;
  std::vector<nn::Module::SavedForward> saved(static_cast<std::size_t>(m));
  std::vector<Tensor> output_grads(static_cast<std::size_t>(m));
  std::vector<std::pair<tensor::Shape, tensor::DType>> outputs(static_cast<std::size_t>(m));  // each gradient's

  auto forward = [&](int i) {
    const Tensor x = first ? inputs.slice(i * rows, (i + 1) * rows) : receive(*activations_, s - 1);
    TraceScope span(tracer_, "compute", "forward");
    if (span.active()) span.set_args("\"micro_batch\":" + std::to_string(i));
    const auto t0 = Clock::now();
    const Tensor y = stage_.forward(x);
    saved[static_cast<std::size_t>(i)] = stage_.take_saved_forward();
    if (last) {
      loss_sum += loss.forward(y, targets.slice(i * rows, (i + 1) * rows));
      output_grads[static_cast<std::size_t>(i)] = loss.backward(1.0 / m);
    }
    busy += seconds_since(t0);
    if (!last) {
      send(*activations_, y, s + 1, true);
      outputs[static_cast<std::size_t>(i)] = {y.shape(), y.dtype()};
    }
  };
  auto backward = [&](int i) {
    const auto k = static_cast<std::size_t>(i);
    const Tensor g = last ? std::move(output_grads[k]) : receive_like(*gradients_, outputs[k], s + 1);
    TraceScope span(tracer_, "compute", "backward");
    if (span.active()) span.set_args("\"micro_batch\":" + std::to_string(i) + ",\"recomputes_forward\":true");
    const auto t0 = Clock::now();
    stage_.restore_saved_forward(std::move(saved[static_cast<std::size_t>(i)]));
    const Tensor gx = stage_.backward(g);
    busy += seconds_since(t0);
    if (!first) send(*gradients_, gx, s - 1, false);
  };

  try {
    if (schedule_ == PipelineSchedule::gpipe) {
      for (int i = 0; i < m; ++i) forward(i);
      for (int i = 0; i < m; ++i) backward(i);
    } else {
      const int warm = std::min(p - s - 1, m);
      for (int i = 0; i < warm; ++i) forward(i);
      for (int i = warm; i < m; ++i) {
        forward(i);
        backward(i - warm);
      }
      for (int i = m - warm; i < m; ++i) backward(i);
    }
    finish_sends();
  } catch (...) {
    stage_.release_activations();
    try {
      finish_sends();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  double mean = last ? loss_sum / m : 0.0;
  pp_.broadcast(Buffer(&mean, 1), p - 1);
  stats_.seconds = seconds_since(start);
  stats_.busy_seconds = busy;
  return mean;
}

Tensor Pipeline::forward(const Tensor& inputs) {
  const int s = pp_.rank(), p = pp_.size();
  const Tensor x = s == 0 ? inputs : receive(*activations_, s - 1);
  stage_.set_activation_checkpointing(false);  // no backward follows
  Tensor y;
  try {
    y = stage_.forward(x);
  } catch (...) {
    stage_.set_activation_checkpointing(true);
    throw;
  }
  stage_.set_activation_checkpointing(true);
  if (s + 1 < p) {
    send(*activations_, y, s + 1, true);
    finish_sends();
    return Tensor();
  }
  return y;
}

// ------------------------------------------------------------------ the GPT's stages

GptStage::GptStage(const nn::GPTConfig& config, std::uint64_t seed, int stage, int stages,
                   collectives::Communicator* tp)
    : stage_(stage), stages_(stages) {
  TROUPE_CHECK(stages >= 1 && stage >= 0 && stage < stages, "GptStage: stage ", stage, " of ", stages);
  TROUPE_CHECK(config.n_layer >= stages, "GptStage: ", config.n_layer, " blocks do not fill ", stages,
               " pipeline stages");
  std::tie(begin_, end_) = shard_range(config.n_layer, stage, stages);
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

void GptStage::sum_tied_gradient(collectives::Communicator& pp) {
  if (stages_ == 1 || !(first() || last())) return;
  TROUPE_CHECK(tied_->grad.defined(), type_name(), ".sum_tied_gradient: the tied table has no gradient");
  const int peer = first() ? stages_ - 1 : 0;
  const Tensor mine = tied_->grad.clone();
  Tensor theirs = Tensor::empty(mine.shape(), mine.dtype());
  collectives::Work sent = pp.send_async(Buffer(mine), peer, kTied);
  pp.recv(Buffer(theirs), peer, kTied);
  sent.wait();
  tensor::add_(tied_->grad, theirs);  // a + b on one stage, b + a on the other: the same bits
}

void GptStage::checkpoint_blocks(std::int64_t every) {
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    blocks_[i]->set_activation_checkpointing(every > 0 && (begin_ + static_cast<std::int64_t>(i)) % every == 0);
}

double pipeline_clip_grad_norm(PipelineStage& stage, double max_norm, collectives::Communicator& pp,
                               collectives::Communicator* tp) {
  const auto splits = tp != nullptr ? tensor_parallel_splits(stage) : std::map<std::string, TensorSplit>{};
  double split = 0, whole = 0;
  for (const auto& [name, param] : stage.named_parameters())
    if (param->grad.defined() && param != stage.tied_copy())
      (splits.count(name) ? split : whole) += squares(param->grad);
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

// ------------------------------------------------------------ checkpoints

namespace {

// `dict`'s entries of every stage in stage order, or (scalars_once) those without a '/'
// from stage 0 alone.
nn::StateDict gather_stages(const nn::StateDict& dict, collectives::Communicator& pp, bool scalars_once) {
  nn::StateDict mine;
  for (const auto& [name, value] : dict)
    if (!scalars_once || pp.rank() == 0 || name.find('/') != std::string::npos) mine.insert(name, value);
  nn::StateDict full;
  for (int owner = 0; owner < pp.size(); ++owner) {
    const bool me = owner == pp.rank();
    std::int64_t count = me ? static_cast<std::int64_t>(mine.size()) : 0;
    pp.broadcast(Buffer(&count, 1), owner);
    auto entry = mine.begin();
    for (std::int64_t e = 0; e < count; ++e) {
      std::vector<std::int64_t> meta(3 + kMaxDims, 0);
      std::string name;
      if (me) {
        name = entry->first;
        meta[0] = static_cast<std::int64_t>(name.size());
        meta[1] = static_cast<std::int64_t>(entry->second.dtype());
        meta[2] = entry->second.dim();
        for (std::int64_t d = 0; d < entry->second.dim(); ++d)
          meta[3 + static_cast<std::size_t>(d)] = entry->second.size(d);
      }
      pp.broadcast(Buffer(meta), owner);
      std::vector<std::uint8_t> chars(name.begin(), name.end());
      chars.resize(static_cast<std::size_t>(meta[0]));
      pp.broadcast(Buffer(chars), owner);
      name.assign(chars.begin(), chars.end());
      tensor::Shape shape;
      for (std::int64_t d = 0; d < meta[2]; ++d) shape.push_back(meta[3 + static_cast<std::size_t>(d)]);
      Tensor value = me ? entry->second.clone() : Tensor::empty(shape, static_cast<tensor::DType>(meta[1]));
      pp.broadcast(Buffer(value), owner);
      full.insert(name, value);
      if (me) ++entry;
    }
  }
  return full;
}

}  // namespace

nn::StateDict pipeline_full_state_dict(nn::Module& stage, collectives::Communicator& pp,
                                       collectives::Communicator* tp) {
  return gather_stages(tp != nullptr ? full_state_dict(stage, *tp) : stage.state_dict(), pp, false);
}

PipelineStateDicts::PipelineStateDicts(PipelineStage& stage, nn::Optimizer& optimizer, collectives::Communicator& pp,
                                       collectives::Communicator* tp, std::string tied_name)
    : stage_(stage),
      optimizer_(&optimizer),
      oss_(nullptr),
      pp_(pp),
      tp_(tp),
      splits_(tp != nullptr ? tensor_parallel_splits(stage) : std::map<std::string, TensorSplit>{}),
      tied_name_(std::move(tied_name)) {}

PipelineStateDicts::PipelineStateDicts(PipelineStage& stage, OSS& optimizer, collectives::Communicator& pp,
                                       collectives::Communicator* tp, std::string tied_name)
    : PipelineStateDicts(stage, optimizer.base(), pp, tp, std::move(tied_name)) {
  optimizer_ = nullptr;
  oss_ = &optimizer;
}

nn::StateDict PipelineStateDicts::whole_random_state(nn::StateDict local) { return gather_stages(local, pp_, false); }

std::string PipelineStateDicts::tied_copy_name() const {
  const nn::Parameter* copy = stage_.tied_copy();
  if (!copy) return "";
  for (const auto& [name, param] : stage_.named_parameters())
    if (param == copy) return name;
  return "";
}

nn::StateDict PipelineStateDicts::model_state_dict() { return pipeline_full_state_dict(stage_, pp_, tp_); }

nn::StateDict PipelineStateDicts::optimizer_state_dict() {
  const std::string copy = tied_copy_name();
  nn::StateDict mine;
  const nn::StateDict local = oss_ != nullptr ? oss_->state_dict() : optimizer_->state_dict();
  for (const auto& [key, value] : tp_ != nullptr ? full_optimizer_state_dict(local, splits_, *tp_) : local)
    if (copy.empty() || key.rfind(copy + "/", 0) != 0) mine.insert(key, value);
  return gather_stages(mine, pp_, true);
}

void PipelineStateDicts::load_model_state_dict(const nn::StateDict& dict) {
  nn::StateDict mine;
  for (const auto& [name, value] : stage_.state_dict()) mine.insert(name, dict.at(name));
  if (tp_ != nullptr)
    load_full_state_dict(stage_, mine, *tp_);
  else
    stage_.load_state_dict(mine);
}

void PipelineStateDicts::load_optimizer_state_dict(const nn::StateDict& dict) {
  const std::string copy = tied_copy_name();
  std::vector<std::string> names;
  for (const auto& [name, param] : stage_.named_parameters()) names.push_back(name);
  nn::StateDict mine;
  for (const auto& [key, value] : dict) {
    const auto cut = key.rfind('/');
    if (cut == std::string::npos) {
      mine.insert(key, value);
      continue;
    }
    const std::string param = key.substr(0, cut), slot = key.substr(cut);
    if (std::find(names.begin(), names.end(), param) != names.end()) mine.insert(key, value);
    if (!copy.empty() && param == tied_name_) mine.insert(copy + slot, value);
  }
  const nn::StateDict part = tp_ != nullptr ? optimizer_state_dict_part(mine, splits_, *tp_) : mine;
  if (oss_ != nullptr)
    oss_->load_state_dict(part);
  else
    optimizer_->load_state_dict(part);
}

}  // namespace troupe::parallel
