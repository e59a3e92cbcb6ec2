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
  if (name == "interleaved") return PipelineSchedule::interleaved;
  TROUPE_THROW(InvalidArgument, "unknown pipeline schedule '", name, "': gpipe, 1f1b or interleaved");
}

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::interleaved: return "interleaved";
  }
  return "?";
}

// ------------------------------------------------------------------ the schedule

Pipeline::Pipeline(nn::Module& stage, collectives::Communicator& pp, PipelineSchedule schedule, int micro_batches)
    : Pipeline(std::vector<nn::Module*>{&stage}, pp, schedule, micro_batches) {}

Pipeline::Pipeline(std::vector<nn::Module*> chunks, collectives::Communicator& pp, PipelineSchedule schedule,
                   int micro_batches)
    : chunks_(std::move(chunks)), pp_(pp), schedule_(schedule), micro_batches_(micro_batches) {
  TROUPE_CHECK(micro_batches >= 1, "Pipeline: micro_batches must be >= 1, got ", micro_batches);
  TROUPE_CHECK(!chunks_.empty() && std::find(chunks_.begin(), chunks_.end(), nullptr) == chunks_.end(),
               "Pipeline: no stage given");
  const bool interleaved = schedule == PipelineSchedule::interleaved;
  TROUPE_CHECK(interleaved == (chunks_.size() > 1), "Pipeline: the interleaved schedule runs two or more chunks a ",
               "rank (InterleavedStage), and only it does; got ", chunks_.size(), " chunk(s) with ",
               pipeline_schedule_name(schedule));
  TROUPE_CHECK(!interleaved || (pp.size() > 1 && micro_batches % pp.size() == 0), "Pipeline: the interleaved ",
               "schedule runs over two or more ranks, with a multiple of their number (", pp.size(),
               ") in micro-batches; got ", micro_batches);
  for (nn::Module* chunk : chunks_) chunk->set_activation_checkpointing(true);
  // Links 0, 1, 0, 1, ...; with an odd p the wrap-around link (p - 1 to 0) would share
  // rank 0's parity, so it has a third communicator.
  const int links = pp.size() == 1 ? 0 : (pp.size() % 2 == 1 ? 3 : 2);
  for (int i = 0; i < links; ++i) {
    activations_.push_back(pp.split(0, pp.rank()));
    gradients_.push_back(pp.split(0, pp.rank()));
  }
}

collectives::Communicator& Pipeline::link(std::vector<std::unique_ptr<collectives::Communicator>>& comms, int l) {
  const int p = pp_.size();
  l = (l + p) % p;
  return *comms[static_cast<std::size_t>(p % 2 == 1 && l == p - 1 ? 2 : l % 2)];
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
  for (auto& comm : activations_) comm->set_tracer(tracer, "pp activations");
  for (auto& comm : gradients_) comm->set_tracer(tracer, "pp gradients");
}

std::chrono::nanoseconds Pipeline::wait_time() const {
  std::chrono::nanoseconds waited{0};
  for (const auto& comm : activations_) waited += comm->wait_time();
  for (const auto& comm : gradients_) waited += comm->wait_time();
  return waited;
}

void Pipeline::finish_sends() {
  for (auto& work : sends_) work.wait();
  sends_.clear();
  sending_.clear();
}

double Pipeline::forward_backward(const Tensor& inputs, const Tensor& targets, const PipelineLoss& loss) {
  const int s = pp_.rank(), p = pp_.size(), m = micro_batches_, v = static_cast<int>(chunks_.size());
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
  // Per chunk and micro-batch: the saved forward, and the shape its gradient comes back in.
  const auto at = [m](int c, int i) { return static_cast<std::size_t>(c * m + i); };
  std::vector<nn::Module::SavedForward> saved(static_cast<std::size_t>(v * m));
  std::vector<std::pair<tensor::Shape, tensor::DType>> outputs(static_cast<std::size_t>(v * m));
  std::vector<Tensor> output_grads(static_cast<std::size_t>(m));
  // The whole model's first stage (this rank's chunk 0 on rank 0) and last.
  const auto model_first = [&](int c) { return first && c == 0; };
  const auto model_last = [&](int c) { return last && c == v - 1; };

  auto forward = [&](int c, int i) {
    nn::Module& chunk = *chunks_[static_cast<std::size_t>(c)];
    const Tensor x =
        model_first(c) ? inputs.slice(i * rows, (i + 1) * rows) : receive(link(activations_, s - 1), (s - 1 + p) % p);
    TraceScope span(tracer_, "compute", "forward");
    if (span.active())
      span.set_args("\"micro_batch\":" + std::to_string(i) + (v > 1 ? ",\"chunk\":" + std::to_string(c) : ""));
    const auto t0 = Clock::now();
    const Tensor y = chunk.forward(x);
    saved[at(c, i)] = chunk.take_saved_forward();
    if (model_last(c)) {
      loss_sum += loss.forward(y, targets.slice(i * rows, (i + 1) * rows));
      output_grads[static_cast<std::size_t>(i)] = loss.backward(1.0 / m);
    }
    busy += seconds_since(t0);
    if (!model_last(c)) {
      send(link(activations_, s), y, (s + 1) % p, true);
      outputs[at(c, i)] = {y.shape(), y.dtype()};
    }
  };
  auto backward = [&](int c, int i) {
    nn::Module& chunk = *chunks_[static_cast<std::size_t>(c)];
    const Tensor g = model_last(c) ? std::move(output_grads[static_cast<std::size_t>(i)])
                                   : receive_like(link(gradients_, s), outputs[at(c, i)], (s + 1) % p);
    TraceScope span(tracer_, "compute", "backward");
    if (span.active())
      span.set_args("\"micro_batch\":" + std::to_string(i) + (v > 1 ? ",\"chunk\":" + std::to_string(c) : "") +
                    ",\"recomputes_forward\":true");
    const auto t0 = Clock::now();
    chunk.restore_saved_forward(std::move(saved[at(c, i)]));
    const Tensor gx = chunk.backward(g);
    busy += seconds_since(t0);
    if (!model_first(c)) send(link(gradients_, s - 1), gx, (s - 1 + p) % p, false);
  };

  try {
    if (schedule_ == PipelineSchedule::gpipe) {
      for (int i = 0; i < m; ++i) forward(0, i);
      for (int i = 0; i < m; ++i) backward(0, i);
    } else if (schedule_ == PipelineSchedule::one_f_one_b) {
      const int warm = std::min(p - s - 1, m);
      for (int i = 0; i < warm; ++i) forward(0, i);
      for (int i = warm; i < m; ++i) {
        forward(0, i);
        backward(0, i - warm);
      }
      for (int i = m - warm; i < m; ++i) backward(0, i);
    } else {
      // Megatron's order: the k-th forward (or backward) of a rank runs micro-batch
      // (k / pv) p + k mod p through chunk (k / p) mod v (backwards: the chunks in
      // reverse); 2 (p - s - 1) + (v - 1) p forwards warm the pipe up.
      const int total = m * v;
      const auto micro_batch = [&](int k) { return (k / (p * v)) * p + k % p; };
      const auto chunk = [&](int k, bool forwards) { return forwards ? (k / p) % v : v - 1 - (k / p) % v; };
      const int warm = m == p ? total : std::min(2 * (p - s - 1) + (v - 1) * p, total);
      for (int k = 0; k < warm; ++k) forward(chunk(k, true), micro_batch(k));
      for (int k = 0; k < total - warm; ++k) {
        forward(chunk(warm + k, true), micro_batch(warm + k));
        backward(chunk(k, false), micro_batch(k));
      }
      for (int k = total - warm; k < total; ++k) backward(chunk(k, false), micro_batch(k));
    }
    finish_sends();
  } catch (...) {
    for (nn::Module* chunk : chunks_) chunk->release_activations();
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
  const int s = pp_.rank(), p = pp_.size(), v = static_cast<int>(chunks_.size());
  Tensor y;
  for (int c = 0; c < v; ++c) {
    nn::Module& chunk = *chunks_[static_cast<std::size_t>(c)];
    const Tensor x = s == 0 && c == 0 ? inputs : receive(link(activations_, s - 1), (s - 1 + p) % p);
    chunk.set_activation_checkpointing(false);  // no backward follows
    try {
      y = chunk.forward(x);
    } catch (...) {
      chunk.set_activation_checkpointing(true);
      throw;
    }
    chunk.set_activation_checkpointing(true);
    if (s == p - 1 && c == v - 1) return y;
    send(link(activations_, s), y, (s + 1) % p, true);
    finish_sends();
  }
  return Tensor();
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
  const int peer = (first() ? stages_ - 1 : 0) % pp.size();
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

// ------------------------------------------------------------ interleaved stages

namespace {

bool is_dict(const std::shared_ptr<nn::Module>& module) {
  return dynamic_cast<nn::ModuleDict*>(module.get()) != nullptr;
}

// Adds `from`'s children to `into` (a dict of the InterleavedStage's own), sharing the
// layers; a dict both hold (a GPT's "transformer", its "h") is merged one level down.
void merge_tree(nn::ModuleDict& into, const nn::Module& from, const std::string& path) {
  for (const std::string& name : from.child_names()) {
    const auto child = from.shared_child(name);
    const auto held = into.shared_child(name);
    if (held == nullptr && is_dict(child))
      merge_tree(into.add(name, std::make_shared<nn::ModuleDict>()), *child, path + name + ".");
    else if (held == nullptr)
      into.add(name, child);
    else
      TROUPE_CHECK(is_dict(held) && is_dict(child), "InterleavedStage: two chunks hold '", path, name, "'");
    if (held != nullptr) merge_tree(static_cast<nn::ModuleDict&>(*held), *child, path + name + ".");
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
    // The top level is this module's own; below it, dicts of its own (merge_tree).
    for (const std::string& name : chunk->child_names()) {
      const auto child = chunk->shared_child(name);
      const auto held = shared_child(name);
      if (held == nullptr && is_dict(child))
        merge_tree(register_module(name, std::make_shared<nn::ModuleDict>()), *child, name + ".");
      else if (held == nullptr)
        register_module(name, child);
      else
        TROUPE_CHECK(is_dict(held) && is_dict(child), "InterleavedStage: two chunks hold '", name, "'");
      if (held != nullptr) merge_tree(static_cast<nn::ModuleDict&>(*held), *child, name + ".");
    }
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

void InterleavedStage::sum_tied_gradient(collectives::Communicator& pp) {
  for (const auto& chunk : chunks_) chunk->sum_tied_gradient(pp);
}

const nn::Parameter* InterleavedStage::tied_copy() const {
  for (const auto& chunk : chunks_)
    if (const nn::Parameter* copy = chunk->tied_copy()) return copy;
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

// Every stage's entries in the whole model's stage order: chunks[c] is this rank's
// stage c x p + rank (every rank passes as many). With scalars_once, entries without a
// '/' (an optimizer's scalars) come from stage 0 alone.
nn::StateDict gather_stages(const std::vector<nn::StateDict>& chunks, collectives::Communicator& pp,
                            bool scalars_once) {
  const int p = pp.size(), v = static_cast<int>(chunks.size());
  nn::StateDict full;
  for (int stage = 0; stage < p * v; ++stage) {
    const int owner = stage % p;
    const bool me = owner == pp.rank();
    nn::StateDict mine;
    if (me)
      for (const auto& [name, value] : chunks[static_cast<std::size_t>(stage / p)])
        if (!scalars_once || stage == 0 || name.find('/') != std::string::npos) mine.insert(name, value);
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

// An optimizer's state ("parameter/slot" keys, and scalars) split by the chunk holding
// each parameter; the scalars go with chunk 0.
std::vector<nn::StateDict> by_chunk(const nn::StateDict& dict, PipelineStage& stage) {
  const std::vector<PipelineStage*> chunks = stage.chunks();
  std::map<std::string, std::size_t> owner;
  for (std::size_t c = 0; c < chunks.size(); ++c)
    for (const auto& [name, param] : chunks[c]->named_parameters()) owner.emplace(name, c);
  std::vector<nn::StateDict> out(chunks.size());
  for (const auto& [key, value] : dict) {
    const auto cut = key.rfind('/');
    const auto found = cut == std::string::npos ? owner.end() : owner.find(key.substr(0, cut));
    out[found == owner.end() ? 0 : found->second].insert(key, value);
  }
  return out;
}

}  // namespace

nn::StateDict pipeline_full_state_dict(nn::Module& stage, collectives::Communicator& pp,
                                       collectives::Communicator* tp) {
  std::vector<nn::Module*> chunks{&stage};
  if (auto* staged = dynamic_cast<PipelineStage*>(&stage)) {
    const std::vector<PipelineStage*> held = staged->chunks();
    chunks.assign(held.begin(), held.end());
  }
  std::vector<nn::StateDict> dicts;
  for (nn::Module* chunk : chunks) dicts.push_back(tp != nullptr ? full_state_dict(*chunk, *tp) : chunk->state_dict());
  return gather_stages(dicts, pp, false);
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

nn::StateDict PipelineStateDicts::whole_random_state(nn::StateDict local) {
  std::vector<nn::StateDict> chunks(stage_.chunks().size());
  chunks[0] = std::move(local);
  return gather_stages(chunks, pp_, false);
}

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
  return gather_stages(by_chunk(mine, stage_), pp_, true);
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
