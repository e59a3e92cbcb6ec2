// Pipeline parallelism: a model cut into pp.size() consecutive stages, one per rank of a
// `pp` communicator; a batch split into micro-batches that flow forward through the
// stages and back, activations and their gradients sent point to point.
//
// Schedules (GPipe; 1F1B, PipeDream-Flush as Megatron runs it), stage s of p with m
// micro-batches:
//   gpipe        all m forwards, then all m backwards
//   1f1b         min(p - s - 1, m) forwards, then one forward and one backward in
//                turn, then the backwards left: at most p - s micro-batches in flight
//   interleaved  Megatron's interleaved 1F1B: the model cut into p x v stages, rank s
//                holding v of them (s, s + p, ...; InterleavedStage), forwards taken
//                p micro-batches at a time through each of its chunks in turn, then
//                1F1B over (chunk, micro-batch) pairs; m must be a multiple of p
//   zero-bubble  1f1b's order with each backward split in two (nn/weight_gradients.hpp):
//                B, the input's gradient, which the previous stage waits for, then W,
//                the weights' gradients, queued and run while the stage would wait
//                for a message, or once more than p - s - 1 are queued, or at the end
// gpipe and 1f1b idle a stage for (p - 1) / (m + p - 1) of a step in theory, 1F1B
// holding fewer micro-batches at once; interleaved for (p - 1) / (v m + p - 1), at
// v times the messages. zero-bubble is ZB-H1 of Qi et al. (ICLR 2024), its W passes
// placed greedily at run time rather than from a profiled plan: the backward chain
// through the stages carries B alone, so the bubble shrinks by about the W passes'
// share of a stage's work, with 1F1B's gradients bit for bit, at 1F1B's memory plus
// the queued passes' (each keeps its Linears' inputs and output gradients). A stage keeps each in-flight micro-batch's
// activations: its caches are taken out of the stage after that micro-batch's forward and put back before its backward
// (nn::Module::take_activations), since troupe's layers cache one forward. A stage or its blocks set to activation
// checkpointing keep only their inputs and recompute in backward (Megatron's full or selective recompute), bit for bit
// the same. Gradients accumulate as the mean over the micro-batches, which is one rank's batch-mean gradient to
// rounding. A stage's failure is its rank's failure, which troupe-run already handles by restarting the job from the
// last checkpoint.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/nn/state_dict.hpp"
#include "troupe/nn/weight_gradients.hpp"
#include "troupe/parallel/oss.hpp"
#include "troupe/parallel/state_slices.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/trace.hpp"

namespace troupe::parallel {

using tensor::Tensor;

enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, zero_bubble };
// "gpipe", "1f1b", "interleaved" or "zero-bubble"; anything else is an InvalidArgument
// naming them.
PipelineSchedule parse_pipeline_schedule(std::string_view name);
const char* pipeline_schedule_name(PipelineSchedule schedule);

// The last stage's loss: forward(output, targets) returns a micro-batch's mean loss,
// backward(scale) the gradient of scale x that loss with respect to the output.
struct PipelineLoss {
  std::function<double(const Tensor& output, const Tensor& targets)> forward;
  std::function<Tensor(double scale)> backward;
};

struct PipelineStats {
  double seconds = 0;       // the last forward_backward, wall time
  double busy_seconds = 0;  // of which computing (forwards, any recomputes, backwards, the loss)
  // zero-bubble: the weight-gradient passes that ran while a message was awaited (of m).
  int weight_passes_while_waiting = 0;
  double idle_fraction() const { return seconds > 0 ? 1.0 - busy_seconds / seconds : 0.0; }
};

class Pipeline {
 public:
  // `stage` is this rank's part of the model; pp and stage outlive the pipeline. The
  // stage's device (that of its parameters when the pipeline is built) is where it
  // receives activations and gradients; on CUDA, pp is an NCCL communicator.
  Pipeline(nn::Module& stage, collectives::Communicator& pp, PipelineSchedule schedule, int micro_batches);
  // This rank's chunks of a model cut into pp.size() x chunks.size() stages: chunk c is
  // stage c x pp.size() + pp.rank() (InterleavedStage::chunks). More than one chunk
  // takes the interleaved schedule, and it takes more than one.
  Pipeline(std::vector<nn::Module*> chunks, collectives::Communicator& pp, PipelineSchedule schedule,
           int micro_batches);

  // One batch through the pipe. Every stage passes the batch: the first uses `inputs`,
  // the last `targets` and `loss`; their first dimension must divide into the
  // micro-batches. Gradients accumulate into the stage's parameters. Returns the
  // batch's mean loss, the same on every stage.
  double forward_backward(const Tensor& inputs, const Tensor& targets, const PipelineLoss& loss);
  // Forward only (evaluation): the last stage's output for `inputs`, whole; undefined
  // on the other stages.
  Tensor forward(const Tensor& inputs);

  const PipelineStats& stats() const { return stats_; }
  // Timeline spans: each micro-batch's forward and backward on the calling thread, and
  // the activations' and gradients' sends on rows of their own. Null: none.
  void set_tracer(Tracer* tracer);
  // Time spent waiting for the neighbouring stages' activations and gradients (their
  // communicators' wait_time; the pp communicator's own is the caller's to count).
  std::chrono::nanoseconds wait_time() const;
  PipelineSchedule schedule() const { return schedule_; }
  int micro_batches() const { return micro_batches_; }

 private:
  // The communicators carrying activations (or gradients) on the link from rank l to
  // rank l + 1 (mod p): a rank sends on one link and receives on another, so a receive
  // never waits behind the rank's own sends (a wait covers what its communicator
  // started before it).
  collectives::Communicator& link(std::vector<std::unique_ptr<collectives::Communicator>>& comms, int l);
  void send(collectives::Communicator& comm, const Tensor& t, int peer, int tag, bool header);
  Tensor receive(collectives::Communicator& comm, int peer);
  Tensor receive_like(collectives::Communicator& comm, const std::pair<tensor::Shape, tensor::DType>& like, int peer,
                      int tag);
  void reap_sends();
  void finish_sends();
  void run_weight_pass();

  std::vector<nn::Module*> chunks_;
  tensor::Device device_ = tensor::Device::cpu();  // the stage's, where it receives
  collectives::Communicator& pp_;
  // Activations and gradients each on communicators of their own (split from pp), one
  // per link parity (and one more for the wrap-around link of an odd p): see link().
  std::vector<std::unique_ptr<collectives::Communicator>> activations_, gradients_;
  PipelineSchedule schedule_;
  int micro_batches_;
  std::vector<collectives::Work> sends_;
  std::vector<Tensor> sending_;  // alive until their sends finish
  // zero-bubble: each backward's queued weight gradients, oldest first, with its
  // micro-batch; and forward_backward's compute time so far, which W passes add to.
  std::deque<std::pair<int, nn::WeightGradients>> weight_passes_;
  double busy_ = 0;
  PipelineStats stats_;
  Tracer* tracer_ = nullptr;
};

// A stage of a model cut for the pipeline, as the worker group drives it. A parameter
// used on two stages (a tied table) is stepped on one of them, the owner, which holds
// its optimizer state; the other holds the table and, during a backward, its gradient:
//
//   stage.reduce_tied_gradient(pp);     // after the backward: the sum on the owner
//   clip, optimizer.step();             // the other stage's copy has no gradient now
//   stage.broadcast_tied_table(pp);     // the stepped table back to the other stage
//
// Both are collectives of the two stages' ranks (the others return at once).
class PipelineStage : public nn::Module {
 public:
  // After a backward: the owner's gradient becomes the sum of both uses'; the other
  // stage's is sent and dropped (undefined), so clipping counts it once and an
  // optimizer skips it there.
  virtual void reduce_tied_gradient(collectives::Communicator& pp) = 0;
  // After the owner's step: the other stage's table takes the owner's values.
  virtual void broadcast_tied_table(collectives::Communicator& pp) = 0;
  // The owner's parameter when it copies another stage's (checkpoints name it as that
  // one; null: none here).
  virtual const nn::Parameter* tied_copy() const = 0;
  // The other stage's parameter: held, not stepped here (null: none here).
  virtual const nn::Parameter* tied_unowned() const = 0;
  // The modules the pipeline runs, in the order of the stages they are: this one, or
  // an InterleavedStage's chunks.
  virtual std::vector<PipelineStage*> chunks() { return {this}; }
};

// The v stages one rank holds under the interleaved schedule: stages rank, rank + p,
// ..., rank + (v - 1) p of a model cut into p x v (each a PipelineStage built as that
// stage of p x v, e.g. GptStage(config, seed, rank + c * p, p * v)). Its parameters are
// the union of the chunks', under the same names (their module trees merged, sharing
// the layers), so an optimizer, clipping, checkpoints and data parallelism treat it as
// any stage. It runs only through a Pipeline: forward() and backward() refuse.
class InterleavedStage final : public PipelineStage {
 public:
  explicit InterleavedStage(std::vector<std::unique_ptr<PipelineStage>> chunks);

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;
  // Each chunk's, in turn; GptStage pairs the first and the last of all p x v stages.
  void reduce_tied_gradient(collectives::Communicator& pp) override;
  void broadcast_tied_table(collectives::Communicator& pp) override;
  const nn::Parameter* tied_copy() const override;
  const nn::Parameter* tied_unowned() const override;
  std::vector<PipelineStage*> chunks() override;

 private:
  std::vector<std::unique_ptr<PipelineStage>> chunks_;
};

// How GptStage cuts a GPT's blocks into stages. `parameters` (the default, as
// DeepSpeed's partition_method="parameters") evens out the stages' parameter state,
// the first stage's position table and token table (that one at half: held without
// AdamW's moments) and the last stage's ln_f and the tied table it steps included, so
// neither end stage holds the most where the tables are large against a block;
// `uniform` gives each stage n_layer / stages blocks (shard_range), as Megatron does by
// default.
enum class PipelineCut { parameters, uniform };
PipelineCut parse_pipeline_cut(std::string_view name);  // "parameters" or "uniform"
const char* pipeline_cut_name(PipelineCut cut);

// Blocks of parameter counts `sizes` cut into `stages` consecutive runs of one block or
// more, the first stage also holding `first_extra` parameters and the last
// `last_extra`: the boundaries (stage s holds blocks [cut[s], cut[s + 1])) whose largest
// stage is as small as can be and, of those, whose stages are the most even (the least
// sum of squares; ties to the earlier boundary).
std::vector<std::int64_t> balanced_cut(const std::vector<std::int64_t>& sizes, std::int64_t first_extra,
                                       std::int64_t last_extra, int stages);
// GptStage's boundaries for `config` in `stages`, from the unsplit model's counts (so
// every rank of a tp group cuts alike).
std::vector<std::int64_t> gpt_pipeline_cut(const nn::GPTConfig& config, int stages,
                                           PipelineCut cut = PipelineCut::parameters);

// Stage `stage` of nn::GPT(config, seed) cut into `stages`: consecutive blocks as
// gpt_pipeline_cut(config, stages, cut) says; the first stage also runs wte, wpe and
// the input dropout, the last ln_f and lm_head. Parameters keep the whole model's names. Built from the
// whole model (every rank builds it, keeps its stage, drops the rest), so every layout
// starts from the same weights. The first and last stages each hold the tied table
// (wte's, lm_head's); the last owns it: it steps the sum of both uses' gradients and
// keeps the optimizer state, so the first stage, which also holds wpe, holds the table
// without AdamW's two moments.
//
// With `tp`, the stage is its part of tensor_parallel_gpt(config, seed, *tp): its
// blocks split over tp (tensor_parallel.hpp), the logits of the last stage split by
// vocabulary. The ranks of a tp group run the same schedule, each sending its (equal)
// activations to the rank of its own tp coordinate in the next stage, so the pp
// communicator is the one joining the ranks that differ in pp alone (DeviceMesh's).
class GptStage : public PipelineStage {
 public:
  GptStage(const nn::GPTConfig& config, std::uint64_t seed, int stage, int stages,
           collectives::Communicator* tp = nullptr, PipelineCut cut = PipelineCut::parameters);

  Tensor forward_impl(const Tensor& input) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;

  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  // Blocks [begin, end) of the whole model.
  std::pair<std::int64_t, std::int64_t> blocks() const { return {begin_, end_}; }
  // With more than one stage, collectives of the first and last stages' ranks (stage i
  // on pp rank i mod pp.size(), as interleaved); the others return at once. After a
  // backward: the first stage's table gradient is added to the last's and dropped.
  void reduce_tied_gradient(collectives::Communicator& pp) override;
  // After the step: the last stage's table to the first's.
  void broadcast_tied_table(collectives::Communicator& pp) override;
  // The tied table as the last stage holds it (null elsewhere).
  const nn::Parameter* tied_copy() const override { return last() && !first() ? tied_ : nullptr; }
  // The table as the first stage holds it (null elsewhere).
  const nn::Parameter* tied_unowned() const override { return first() && !last() ? tied_ : nullptr; }
  // Recomputes every `every`-th block's activations in backward (GPT::checkpoint_blocks;
  // train_gpt --activation-checkpointing); 0: none.
  void checkpoint_blocks(std::int64_t every);

 private:
  int stage_, stages_;
  std::int64_t begin_ = 0, end_ = 0;
  nn::Embedding* wte_ = nullptr;
  nn::Embedding* wpe_ = nullptr;
  nn::Module* drop_ = nullptr;
  std::vector<nn::Module*> blocks_;
  nn::Module* ln_f_ = nullptr;
  nn::Module* lm_head_ = nullptr;
  nn::Parameter* tied_ = nullptr;
  std::shared_ptr<nn::Module> table_owner_;  // wte, kept alive on the last stage for its table
};

// The norm of every stage's gradients (after reduce_tied_gradient, which leaves a tied
// table's on its owner alone; with `tp`, split parameters' squares summed over tp and
// whole ones counted once), and clipping to it: every rank scales alike. A collective
// over pp (and tp).
double pipeline_clip_grad_norm(PipelineStage& stage, double max_norm, collectives::Communicator& pp,
                               collectives::Communicator* tp = nullptr);

// The whole model's state dict, every stage's entries in stage order (the whole
// model's order; with `tp`, each gathered over tp first), on every rank. A collective
// over pp (and tp).
nn::StateDict pipeline_full_state_dict(nn::Module& stage, collectives::Communicator& pp,
                                       collectives::Communicator* tp = nullptr);

class DistributedDataParallel;

// A pipeline stage's state as checkpoints keep it: the whole model's model group, and
// the optimizer group of the whole model's optimizer (a tied table's slots from its
// owner, named as the parameter it copies; the scalars once), gathered over pp;
// loading takes this stage's entries (the owner's slots from that name). With `tp` (a stage split over it), each entry
// is gathered over tp first, and loading takes this rank's part. So a file of any layout resumes at any other. With an
// OSS (the stage's optimizer state sharded over its data-parallel ranks, ZeRO-1), the stage's optimizer state is first
// consolidated over those ranks (OSS::state_dict, a collective over them), and loading hands the stage's whole state to
// OSS, which keeps each rank's partition.
class PipelineStateDicts final : public ShardedStateDicts {
 public:
  PipelineStateDicts(PipelineStage& stage, nn::Optimizer& optimizer, collectives::Communicator& pp,
                     collectives::Communicator* tp = nullptr, std::string tied_name = "transformer.wte.weight");
  PipelineStateDicts(PipelineStage& stage, OSS& optimizer, collectives::Communicator& pp,
                     collectives::Communicator* tp = nullptr, std::string tied_name = "transformer.wte.weight");

  nn::StateDict model_state_dict() override;
  nn::StateDict optimizer_state_dict() override;
  void load_model_state_dict(const nn::StateDict& dict) override;
  void load_optimizer_state_dict(const nn::StateDict& dict) override;
  std::int64_t micro_step() const override { return 0; }  // a step is one pipeline pass
  void set_micro_step(std::int64_t) override {}
  nn::StateDict whole_random_state(nn::StateDict local) override;

 private:
  // The name `p` has on this stage ("" for none, or null).
  std::string name_of(const nn::Parameter* p) const;

  PipelineStage& stage_;
  nn::Optimizer* optimizer_;  // one of the two
  OSS* oss_;
  collectives::Communicator& pp_;
  collectives::Communicator* tp_;
  std::map<std::string, TensorSplit> splits_;  // with tp: the stage's split parameters
  std::string tied_name_;
};

}  // namespace troupe::parallel
