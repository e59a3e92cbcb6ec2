// ParallelModel: one rank's part in training a model with its peers, behind the one
// interface the worker group holds whatever the layout:
//   DataParallelModel  DDP over the data-parallel ranks (ddp), with f32 master weights
//                      under a bf16 model, or a tensor-parallel model inside it
//   ShardedModel       zero1, zero2, fsdp (sharded_model.hpp)
//   PipelineModel      a pipeline stage, its gradients averaged over the dp ranks (its
//                      optimizer state sharded over them under zero1)
// The worker builds one (the only place the layout is chosen), then trains, evaluates,
// hashes and checkpoints through it alone.
//
// Contract: a collective in some layouts (every rank calls it together, in the same
// order, from one thread); the module, the optimizer's parameters and the
// communicators outlive it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/nn/state_dict.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/master_weights.hpp"
#include "troupe/parallel/oss.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/sharding.hpp"
#include "troupe/parallel/state_slices.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/trace.hpp"

namespace troupe::parallel {

// The objective, as the layouts call it: forward(output, targets) is a micro-batch's
// mean loss (the caller may read the output for its metrics there); backward(scale)
// the gradient of scale x that loss with respect to the output. A pipeline calls it on
// its last stage only, once per micro-batch of the pipeline.
using Loss = PipelineLoss;

struct MicroBatchOptions {
  int accum_steps = 1;               // micro-batches per optimizer step on each rank
  std::int64_t steps_per_epoch = 1;  // micro-batches per epoch (the last window may be short)
  double max_grad_norm = 0;          // 0: no clipping
};

struct MicroBatchResult {
  double loss = 0;       // the micro-batch's mean loss (a pipeline's: over all its micro-batches, on every stage)
  bool stepped = false;  // the optimizer ran
};

class ParallelModel {
 public:
  virtual ~ParallelModel() = default;

  // One micro-batch of this rank's share: forward, the loss, backward, and the
  // optimizer step when the accumulation window closes.
  virtual MicroBatchResult train_micro_batch(const Tensor& inputs, const Tensor& targets, const Loss& loss,
                                             const MicroBatchOptions& options) = 0;
  // Evaluation's forward: the model's output for `inputs`, or undefined on a rank that
  // has none (a pipeline stage before the last).
  virtual Tensor evaluate(const Tensor& inputs) = 0;
  // evaluate() is a collective (FSDP and zero2 gather): every rank must call it as many
  // times, a rank short of samples with a dummy batch.
  virtual bool evaluate_is_collective() const { return false; }

  virtual nn::Optimizer& optimizer() = 0;
  // The position in the epoch's accumulation windows (the checkpoint's status group).
  virtual std::int64_t micro_step() const = 0;
  virtual void set_micro_step(std::int64_t step) = 0;

  // FNV-1a over the whole model's parameters, the same on every rank (collective where
  // the model is split or sharded).
  virtual std::uint64_t parameter_hash() = 0;
  // The whole model's state dict (f32 masters under a bf16 model): on every rank, or,
  // when whole_state_is_collective(), gathered to rank 0 of the world (the others' is
  // empty or partial).
  virtual nn::StateDict whole_state_dict() = 0;
  virtual bool whole_state_is_collective() const { return false; }
  // Whether this rank's loss sums are its data-parallel group's: one rank of a split
  // model counts (tensor parallelism's first, a pipeline's last).
  virtual bool counts_results() const { return true; }

  // Where a checkpoint takes the model and optimizer groups from: a sharded or split
  // state (null: the module and optimizer as they are, with ddp() and master_weights()).
  virtual ShardedStateDicts* state_dicts() { return nullptr; }
  virtual DistributedDataParallel* ddp() { return nullptr; }
  virtual MasterWeights* master_weights() { return nullptr; }

  // Timeline spans (troupe/trace.hpp) of its forward, backward and optimizer step.
  virtual void set_tracer(Tracer* tracer) = 0;
  // Time blocked on collectives of communicators it made itself (a pipeline's links);
  // the ones it was given are the caller's to count.
  virtual std::chrono::nanoseconds wait_time() const { return std::chrono::nanoseconds(0); }
};

// Builds the optimizer once DDP has broadcast rank 0's parameters: over the model's
// parameters, or over the f32 masters when there are some.
using DataParallelOptimizer = std::function<std::unique_ptr<nn::Optimizer>(nn::Module& model, MasterWeights* masters)>;

// DDP over `dp`. With `master_weights` (a bf16 model) the optimizer steps f32 masters
// the checkpoints keep. With `tp`, the model is split over it (tensor_parallel.hpp):
// clipping sums over tp, checkpoints gather over it, and only tp's first rank counts.
// With `sequence_parallel` too (a GPT of tensor_parallel_gpt), the model is switched to
// it (enable_sequence_parallel) and its whole parameters' gradients summed over tp
// before each step.
class DataParallelModel final : public ParallelModel {
 public:
  DataParallelModel(nn::Module& model, collectives::Communicator& dp, DdpOptions ddp_options,
                    const DataParallelOptimizer& make_optimizer, bool master_weights,
                    collectives::Communicator* tp = nullptr, bool sequence_parallel = false);

  MicroBatchResult train_micro_batch(const Tensor& inputs, const Tensor& targets, const Loss& loss,
                                     const MicroBatchOptions& options) override;
  Tensor evaluate(const Tensor& inputs) override { return model_.forward(inputs); }
  nn::Optimizer& optimizer() override { return *optimizer_; }
  std::int64_t micro_step() const override { return ddp_->micro_step(); }
  void set_micro_step(std::int64_t step) override { ddp_->set_micro_step(step); }
  std::uint64_t parameter_hash() override;
  nn::StateDict whole_state_dict() override;
  bool whole_state_is_collective() const override { return tp_ != nullptr; }
  bool counts_results() const override { return tp_ == nullptr || tp_->rank() == 0; }
  ShardedStateDicts* state_dicts() override { return tp_state_.get(); }
  DistributedDataParallel* ddp() override { return ddp_.get(); }
  MasterWeights* master_weights() override { return master_.get(); }
  void set_tracer(Tracer* tracer) override { tracer_ = tracer; }

 private:
  nn::Module& model_;
  collectives::Communicator* tp_;
  bool sequence_parallel_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<MasterWeights> master_;
  std::unique_ptr<nn::Optimizer> optimizer_;
  std::unique_ptr<TensorParallelStateDicts> tp_state_;
  Tracer* tracer_ = nullptr;
};

// A pipeline stage (pipeline.hpp) on `pp`, each step one pass of `schedule` over
// `micro_batches` micro-batches; the tied table's gradients summed across its stages,
// every gradient averaged over `dp` (one all-reduce a parameter), clipped over the
// whole model, stepped. One micro-batch of the worker's is the whole pass:
// accum_steps must be 1. With `tp`, the stage is split over it (GptStage's tp): norms,
// hashes and checkpoints gather over tp as well, and only tp's first rank of the last
// stage counts.
//
// `dp_sharding` over dp:
//   ddp    every dp rank steps the whole stage.
//   zero1  the stage's optimizer state sharded (OSS), as DeepSpeed's pipeline engine
//          and Megatron's distributed optimizer do: each dp rank steps its partition,
//          then the owners broadcast the updated parameters.
//   fsdp   zero1's partition, and between steps each dp rank keeps only the parameters
//          it owns (whole tensors): the others are freed after the step and broadcast
//          from their owners when the stage is next used, once a step, as torchtitan's
//          FSDP x PP keeps a stage gathered across its micro-batches. The same bytes
//          travel as under zero1 and the arithmetic is the same, so the bits are too.
// zero2 is refused: the gradients of m micro-batches accumulate whole on a stage, so
// sharding them sheds nothing until the step (DeepSpeed refuses it for the same reason).
class PipelineModel final : public ParallelModel {
 public:
  PipelineModel(PipelineStage& stage, collectives::Communicator& pp, collectives::Communicator& dp,
                PipelineSchedule schedule, int micro_batches, const OptimizerFactory& factory,
                Sharding dp_sharding = Sharding::ddp, collectives::Communicator* tp = nullptr);
  ~PipelineModel() override;

  MicroBatchResult train_micro_batch(const Tensor& inputs, const Tensor& targets, const Loss& loss,
                                     const MicroBatchOptions& options) override;
  // Under fsdp, gathers the stage (a collective over dp) and keeps it until the next step.
  Tensor evaluate(const Tensor& inputs) override;
  bool evaluate_is_collective() const override { return fully_sharded_; }
  // The optimizer over this rank's share of the stage (OSS's partition under zero1, fsdp).
  nn::Optimizer& optimizer() override { return oss_ ? oss_->base() : *optimizer_; }
  std::int64_t micro_step() const override { return 0; }  // a step is one pass
  void set_micro_step(std::int64_t) override {}
  std::uint64_t parameter_hash() override;
  nn::StateDict whole_state_dict() override;
  bool whole_state_is_collective() const override { return true; }
  bool counts_results() const override { return pp_.rank() == pp_.size() - 1 && (tp_ == nullptr || tp_->rank() == 0); }
  ShardedStateDicts* state_dicts() override;
  void set_tracer(Tracer* tracer) override;
  std::chrono::nanoseconds wait_time() const override { return pipe_.wait_time(); }
  // fsdp: whether the parameters this rank does not own are freed now (between steps).
  bool stage_released() const { return !released_.empty(); }

 private:
  class GatheringStateDicts;
  // fsdp: a parameter this rank does not own, freed between steps.
  struct Released {
    nn::Parameter* param;
    tensor::Shape shape;
    tensor::DType dtype;
    tensor::Device device;
  };
  // Allocates the freed parameters; with `values`, their owners broadcast them (a
  // collective over dp), and after a step the first stage's tied table comes from the
  // last (a collective of those stages). No-op unless released or stale.
  void gather_stage(bool values = true);
  void release_stage();
  // Runs f() with the stage gathered (its values broadcast, or only allocated), and
  // frees it again if it was freed before.
  template <class F>
  auto with_stage(bool values, F f) {
    const bool was_released = stage_released();
    gather_stage(values);
    struct Again {
      PipelineModel& model;
      bool on;
      ~Again() {
        if (on) model.release_stage();
      }
    } again{*this, was_released};
    return f();
  }

  PipelineStage& stage_;
  collectives::Communicator& pp_;
  collectives::Communicator& dp_;
  collectives::Communicator* tp_;
  bool fully_sharded_;                        // fsdp
  bool tied_stale_ = false;                   // fsdp: the first stage's tied table awaits the next gather
  std::unique_ptr<OSS> oss_;                  // zero1, fsdp
  std::unique_ptr<nn::Optimizer> optimizer_;  // ddp
  Pipeline pipe_;
  PipelineStateDicts state_;
  std::vector<Released> released_;
  std::unique_ptr<GatheringStateDicts> gathering_;  // fsdp: state_, the stage gathered around each call
  Tracer* tracer_ = nullptr;
};

// FNV-1a over the ranks of `group`'s parameter hashes, in rank order: the split
// model's hash, the same on every rank (an allgather over `group`).
std::uint64_t split_parameter_hash(nn::Module& part, collectives::Communicator& group);
// The same over `group` of each rank's `hash` (a part's, or a group's combined one).
std::uint64_t combined_hash(std::uint64_t hash, collectives::Communicator& group);

}  // namespace troupe::parallel
