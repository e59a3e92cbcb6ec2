#include "troupe/parallel/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "troupe/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

using collectives::Buffer;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kActivation = 101;
constexpr int kGradient = 102;
constexpr std::size_t kMaxDims = 6;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Whether a backward through `module` runs some of its forward again: the whole stage
// checkpointed, or only some of its blocks (GPT::checkpoint_blocks).
bool recomputes_forward(nn::Module& module) {
  if (module.activation_checkpointing()) return true;
  for (const nn::NamedModule& child : module.named_children())
    if (recomputes_forward(*child.module)) return true;
  return false;
}

}  // namespace

PipelineSchedule parse_pipeline_schedule(std::string_view name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  if (name == "interleaved") return PipelineSchedule::interleaved;
  if (name == "zero-bubble") return PipelineSchedule::zero_bubble;
  TROUPE_THROW(InvalidArgument, "unknown pipeline schedule '", name, "': gpipe, 1f1b, interleaved or zero-bubble");
}

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::interleaved: return "interleaved";
    case PipelineSchedule::zero_bubble: return "zero-bubble";
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
  for (nn::Module* chunk : chunks_)
    for (const nn::Parameter* param : chunk->parameters())
      if (param->data.defined() && !param->data.device().is_meta()) device_ = param->data.device();
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
// receive waits for one message before it knows what to post, never two in a row. The
// header is host memory and the data the stage's (on NCCL, the header goes over MPI).
// In a step only a chunk's first micro-batch sends one: the batch splits evenly, so the
// others have its shape (over MPI a receive of another size fails).
void Pipeline::send(collectives::Communicator& comm, const Tensor& t, int peer, int tag, bool header) {
  reap_sends();
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
  sends_.push_back(comm.send_async(Buffer(t), peer, tag));
  sending_.push_back(t);
}

Tensor Pipeline::receive(collectives::Communicator& comm, int peer) {
  Tensor head = Tensor::zeros({static_cast<std::int64_t>(kMaxDims + 2)}, tensor::DType::i64);
  comm.recv(Buffer(head), peer, kActivation);
  const auto* h = head.data<std::int64_t>();
  TROUPE_CHECK(h[1] >= 0 && h[1] <= static_cast<std::int64_t>(kMaxDims) && h[0] >= 0 && h[0] <= 6,
               "Pipeline: a malformed header from stage ", peer);
  tensor::Shape shape;
  for (std::int64_t d = 0; d < h[1]; ++d) shape.push_back(h[2 + d]);
  return receive_like(comm, {shape, static_cast<tensor::DType>(h[0])}, peer, kActivation);
}

// Under zero-bubble, the queued weight passes fill the wait: one at a time, for as long
// as the message has not come.
Tensor Pipeline::receive_like(collectives::Communicator& comm, const std::pair<tensor::Shape, tensor::DType>& like,
                              int peer, int tag) {
  Tensor t = Tensor::empty(like.first, like.second, device_);
  if (weight_passes_.empty()) {
    comm.recv(Buffer(t), peer, tag);
    return t;
  }
  collectives::Work work = comm.recv_async(Buffer(t), peer, tag);
  while (!weight_passes_.empty() && !work.test()) {
    run_weight_pass();
    ++stats_.weight_passes_while_waiting;
  }
  work.wait();
  return t;
}

void Pipeline::run_weight_pass() {
  auto [micro_batch, pass] = std::move(weight_passes_.front());
  weight_passes_.pop_front();
  TraceScope span(tracer_, "compute", "weight gradients");
  if (span.active()) span.set_args("\"micro_batch\":" + std::to_string(micro_batch));
  const auto t0 = Clock::now();
  pass.run();
  busy_ += seconds_since(t0);
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

// Lets go of the sends already done, and of their tensors: under 1F1B a stage then
// holds the outputs of about p micro-batches in flight, not of the step's m.
void Pipeline::reap_sends() {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < sends_.size(); ++i) {
    if (sends_[i].test()) {
      if (!sends_[i].is_success()) sends_[i].wait();  // rethrows its error
      continue;
    }
    sends_[kept] = std::move(sends_[i]);
    sending_[kept] = std::move(sending_[i]);
    ++kept;
  }
  sends_.resize(kept);
  sending_.resize(kept);
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
  double loss_sum = 0;
  busy_ = 0;
  stats_.weight_passes_while_waiting = 0;
  // One stage waits for nothing: there zero-bubble is 1F1B, bit for bit (GPT's tied
  // table would otherwise add its two uses in the other order).
  const bool zero_bubble = schedule_ == PipelineSchedule::zero_bubble && p > 1;
  // Per chunk and micro-batch: the saved forward, and the shape its gradient comes back
  // in; per chunk, the shape its activations come in (from its first micro-batch's).
  const auto at = [m](int c, int i) { return static_cast<std::size_t>(c * m + i); };
  std::vector<nn::ActivationStash> saved(static_cast<std::size_t>(v * m));
  std::vector<std::pair<tensor::Shape, tensor::DType>> outputs(static_cast<std::size_t>(v * m)),
      incoming(static_cast<std::size_t>(v));
  std::vector<Tensor> output_grads(static_cast<std::size_t>(m));
  // The whole model's first stage (this rank's chunk 0 on rank 0) and last.
  const auto model_first = [&](int c) { return first && c == 0; };
  const auto model_last = [&](int c) { return last && c == v - 1; };

  auto forward = [&](int c, int i) {
    nn::Module& chunk = *chunks_[static_cast<std::size_t>(c)];
    Tensor x;
    if (model_first(c)) {
      x = inputs.slice(i * rows, (i + 1) * rows);
    } else {
      collectives::Communicator& in = link(activations_, s - 1);
      const int peer = (s - 1 + p) % p;
      auto& like = incoming[static_cast<std::size_t>(c)];
      x = i == 0 ? receive(in, peer) : receive_like(in, like, peer, kActivation);
      if (i == 0) like = {x.shape(), x.dtype()};
    }
    TraceScope span(tracer_, "compute", "forward");
    if (span.active())
      span.set_args("\"micro_batch\":" + std::to_string(i) + (v > 1 ? ",\"chunk\":" + std::to_string(c) : ""));
    const auto t0 = Clock::now();
    const Tensor y = chunk.forward(x);
    saved[at(c, i)] = chunk.take_activations();
    if (model_last(c)) {
      loss_sum += loss.forward(y, targets.slice(i * rows, (i + 1) * rows));
      output_grads[static_cast<std::size_t>(i)] = loss.backward(1.0 / m);
    }
    busy_ += seconds_since(t0);
    if (!model_last(c)) {
      send(link(activations_, s), y, (s + 1) % p, kActivation, i == 0);
      outputs[at(c, i)] = {y.shape(), y.dtype()};
    }
  };
  auto backward = [&](int c, int i) {
    nn::Module& chunk = *chunks_[static_cast<std::size_t>(c)];
    const Tensor g = model_last(c) ? std::move(output_grads[static_cast<std::size_t>(i)])
                                   : receive_like(link(gradients_, s), outputs[at(c, i)], (s + 1) % p, kGradient);
    TraceScope span(tracer_, "compute", "backward");
    if (span.active())
      span.set_args("\"micro_batch\":" + std::to_string(i) + (v > 1 ? ",\"chunk\":" + std::to_string(c) : "") +
                    (recomputes_forward(chunk) ? ",\"recomputes_forward\":true" : ""));
    const auto t0 = Clock::now();
    chunk.restore_activations(std::move(saved[at(c, i)]));
    nn::WeightGradients later;
    if (zero_bubble) chunk.defer_weight_gradients(&later);
    const Tensor gx = chunk.backward(g);
    if (zero_bubble) chunk.defer_weight_gradients(nullptr);
    busy_ += seconds_since(t0);
    if (!model_first(c)) send(link(gradients_, s - 1), gx, (s - 1 + p) % p, kGradient, false);
    if (!zero_bubble) return;
    // At most p - s - 1 queued (ZB-H1's lag): the last stage runs its own right after
    // sending the gradient, and each stage before it keeps one more for the cool-down.
    weight_passes_.emplace_back(i, std::move(later));
    while (static_cast<int>(weight_passes_.size()) > p - s - 1) run_weight_pass();
  };

  try {
    if (schedule_ == PipelineSchedule::gpipe) {
      for (int i = 0; i < m; ++i) forward(0, i);
      for (int i = 0; i < m; ++i) backward(0, i);
    } else if (schedule_ == PipelineSchedule::one_f_one_b || schedule_ == PipelineSchedule::zero_bubble) {
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
    while (!weight_passes_.empty()) run_weight_pass();
    finish_sends();
  } catch (...) {
    weight_passes_.clear();
    for (nn::Module* chunk : chunks_) {
      chunk->defer_weight_gradients(nullptr);
      chunk->release_activations();
    }
    try {
      finish_sends();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  double mean = last ? loss_sum / m : 0.0;
  pp_.broadcast(Buffer(&mean, 1), p - 1);
  stats_.seconds = seconds_since(start);
  stats_.busy_seconds = busy_;
  return mean;
}

Tensor Pipeline::forward(const Tensor& inputs) {
  const int s = pp_.rank(), p = pp_.size(), v = static_cast<int>(chunks_.size());
  Tensor y;
  for (int c = 0; c < v; ++c) {
    nn::Module& chunk = *chunks_[static_cast<std::size_t>(c)];
    const Tensor x = s == 0 && c == 0 ? inputs : receive(link(activations_, s - 1), (s - 1 + p) % p);
    y = chunk.forward(x);
    chunk.release_activations();  // no backward follows
    if (s == p - 1 && c == v - 1) return y;
    send(link(activations_, s), y, (s + 1) % p, kActivation, true);
    finish_sends();
  }
  return Tensor();
}

}  // namespace troupe::parallel
