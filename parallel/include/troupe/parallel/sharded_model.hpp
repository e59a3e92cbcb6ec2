// ShardedModel: a model trained in one of the sharding modes of the worker group,
// behind the one interface TrainWorker and TrainingState need -- so that the mode is
// one option (`WorkerOptions::sharding`, train_digits' `--sharding`):
//   ddp    DistributedDataParallel + the recipe's optimizer (TrainWorker builds these
//          itself, as it always has; ShardedModel is not used)
//   zero1  DistributedDataParallel + OSS            (optimizer state sharded)
//   zero2  FullyShardedDataParallel, shard_grad_op  (gradients and optimizer state sharded)
//   fsdp   FullyShardedDataParallel, full_shard     (parameters too)
// zero2 shards element by element, per unit (DeepSpeed's stage 2): every rank owns
// 1/W of each unit's flat gradient and optimizer state, whatever the sizes of the
// tensors, and the gradients are reduce-scattered unit by unit while backward runs.
// ShardedDataParallel (fairscale's ShardedDDP over OSS, which owns whole parameters)
// stays available on its own; the mode does not use it because one large tensor
// unbalances a whole-parameter partition (on the 25M MLP, a 4096x4096 weight is 2/3 of
// the model: 1.2x-1.7x ZeRO-2's bytes per rank).
// zero2 and fsdp take the same FsdpOptions (units: one per leaf module with parameters
// unless the options say otherwise).
//
// optimizer_step_with_gradient_accumulation() is DDP's (accumulation.cpp) for these
// modes: windows of `accum_steps` micro-batches (the epoch's last window scaled by its
// own size), the mode's no_sync inside a window, then optional clipping with the true
// global norm, the step, and the gradients dropped. micro_step() is the position in
// the epoch, part of the checkpoint's status group.
//
// Checkpoints: it is the ShardedStateDicts of a TrainingState. The model group is the
// unwrapped model's state dict (FSDP: full_state_dict) and the optimizer group the
// unsharded optimizer's (OSS: the consolidated state_dict; FSDP:
// full_optimizer_state_dict), under the same names as DDP's, so a checkpoint from any
// mode loads into any other. TrainingCheckpoint saves them without gathering: each rank
// hands its pieces (local_state_slices) to the parallel save, into the same file.
//
// With `tp` (zero2 and fsdp; torchtitan's FSDP x TP), `model` is this rank's part of a
// model split over tp (tensor_parallel.hpp) and `comm` the data-parallel ranks that
// hold the same part: FSDP shards the part over them. Clipping sums the split
// parameters' squares over tp; the state dicts are gathered over tp into the whole
// model's (every rank holds them while a checkpoint is written: no local slices), and
// loading takes this rank's parts; only tp's first rank counts results.
//
// Contract: everything except mode()/micro_step() is a collective in some mode --
// every rank calls it together, in the same order, from one thread. The module and
// the communicator outlive this object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/fsdp.hpp"
#include "troupe/parallel/oss.hpp"
#include "troupe/parallel/parallel_model.hpp"
#include "troupe/parallel/sharding.hpp"
#include "troupe/parallel/state_slices.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/trace.hpp"

namespace troupe::parallel {

// FSDP's default units for the worker group: every module without children that holds
// parameters (each Linear of an MLP), so any model built of Sequentials gets one unit per
// layer. A recipe with other needs supplies its own FsdpOptions.
AutoWrapPolicy parameterised_leaf_auto_wrap_policy();

class ShardedModel final : public ShardedStateDicts, public ParallelModel {
 public:
  // `mode` is zero1, zero2 or fsdp. `factory` builds the base optimizer over the
  // parameters (or the flat shards) it is given; `fsdp` is used in zero2 and fsdp mode
  // (its sharding_strategy is the mode's).
  // Broadcasts rank 0's parameters, as DDP does. A model built on the meta device is
  // materialised on fsdp.device instead (nothing broadcast): whole in zero1, which
  // keeps it whole; only each rank's shards in zero2 and fsdp (FsdpOptions::device).
  ShardedModel(Sharding mode, nn::Module& model, collectives::Communicator& comm, const OptimizerFactory& factory,
               std::size_t bucket_bytes, FsdpOptions fsdp = {}, collectives::Communicator* tp = nullptr);
  ShardedModel(const ShardedModel&) = delete;
  ShardedModel& operator=(const ShardedModel&) = delete;
  ~ShardedModel() override;

  Sharding mode() const { return mode_; }
  // The base optimizer on this rank (its partition, or its flat shards): for LR
  // schedules, and TrainingState's optimizer().
  nn::Optimizer& optimizer() override;

  // Forward through the model (FSDP gathers each unit: a collective, in eval too).
  Tensor forward(const Tensor& input);
  // zero2 and fsdp: forward() is a collective (fsdp gathers every unit; zero2 the
  // blocks the last step changed), and until it has run the module's own tensors are
  // not the current parameters -- evaluate through forward() on every rank and read
  // the model through model_state_dict(). zero1: the module is current after a step.
  bool forward_is_collective() const { return fsdp_ != nullptr; }
  // Timeline spans of the backward and the optimizer step (troupe/trace.hpp); null: none.
  void set_tracer(Tracer* tracer) override { tracer_ = tracer; }
  // See DistributedDataParallel::optimizer_step_with_gradient_accumulation; only
  // max_grad_norm of the options is supported here (no scaler, no master weights).
  AccumulationStep optimizer_step_with_gradient_accumulation(const std::function<Tensor(double)>& output_grad,
                                                             int accum_steps, std::int64_t steps_per_epoch,
                                                             double max_grad_norm = 0);

  // FNV-1a over every parameter's full bytes in named order: nn::parameter_hash(model) of
  // the unsharded model (FSDP gathers each parameter to compute it).
  std::uint64_t parameter_hash() override;

  // ParallelModel: forward, optimizer_step_with_gradient_accumulation, and the model's
  // whole state as model_state_dict() gathers it.
  MicroBatchResult train_micro_batch(const Tensor& inputs, const Tensor& targets, const Loss& loss,
                                     const MicroBatchOptions& options) override;
  Tensor evaluate(const Tensor& inputs) override { return forward(inputs); }
  bool evaluate_is_collective() const override { return forward_is_collective(); }
  nn::StateDict whole_state_dict() override { return model_state_dict(); }
  bool whole_state_is_collective() const override { return forward_is_collective(); }
  bool counts_results() const override { return tp_ == nullptr || tp_->rank() == 0; }
  ShardedStateDicts* state_dicts() override { return this; }

  // ShardedStateDicts.
  nn::StateDict model_state_dict() override;
  nn::StateDict optimizer_state_dict() override;
  void load_model_state_dict(const nn::StateDict& dict) override;
  void load_optimizer_state_dict(const nn::StateDict& dict) override;
  // The parallel save's pieces (no tensor gathered): fsdp, each rank's pieces of its
  // flat shards (FullyShardedDataParallel::local_model_slices/local_optimizer_slices);
  // zero1, the model (whole on every rank) split evenly by shard_range, and each
  // parameter's optimizer state whole on its owner (OSS::local_state_slices).
  bool has_local_state_slices() const override { return tp_ == nullptr; }
  std::optional<LocalStateSlices> local_state_slices() override;
  // The sharded resume: zero2 and fsdp read only their slices
  // (FullyShardedDataParallel::load_local_slices); zero1 reads the model straight into
  // the module (it keeps it whole) and only its own parameters' optimizer slots.
  bool loads_local_state_slices() const override { return tp_ == nullptr; }
  void load_local_state_slices(const StateSliceSource& model, const StateSliceSource& optimizer) override;
  std::int64_t micro_step() const override { return micro_step_; }
  void set_micro_step(std::int64_t step) override;

 private:
  void backward(const Tensor& grad, bool sync);

  Sharding mode_;
  nn::Module& model_;
  collectives::Communicator& comm_;
  collectives::Communicator* tp_;
  std::map<std::string, TensorSplit> splits_;       // with tp: the split parameters
  std::unique_ptr<DistributedDataParallel> ddp_;    // zero1
  std::unique_ptr<OSS> oss_;                        // zero1
  std::unique_ptr<FullyShardedDataParallel> fsdp_;  // zero2, fsdp
  std::int64_t micro_step_ = 0;
  Tracer* tracer_ = nullptr;
};

}  // namespace troupe::parallel
