#include "troupe/parallel/parallel_model.hpp"

#include <vector>

#include "troupe/collectives/buffer.hpp"
#include "troupe/error.hpp"

namespace troupe::parallel {

std::uint64_t split_parameter_hash(nn::Module& part, collectives::Communicator& group) {
  return combined_hash(nn::parameter_hash(part), group);
}

std::uint64_t combined_hash(std::uint64_t hash, collectives::Communicator& group) {
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(hash)};
  std::vector<std::int64_t> all(static_cast<std::size_t>(group.size()));
  group.allgather(collectives::Buffer(mine), collectives::Buffer(all));
  std::uint64_t h = 1469598103934665603ULL;
  for (std::int64_t hash : all) h = (h ^ static_cast<std::uint64_t>(hash)) * 1099511628211ULL;
  return h;
}

// ---- DataParallelModel ----

DataParallelModel::DataParallelModel(nn::Module& model, collectives::Communicator& dp, DdpOptions ddp_options,
                                     const DataParallelOptimizer& make_optimizer, bool master_weights,
                                     collectives::Communicator* tp, bool sequence_parallel)
    : model_(model),
      tp_(tp),
      sequence_parallel_(sequence_parallel),
      ddp_(std::make_unique<DistributedDataParallel>(model, dp, ddp_options)) {
  TROUPE_CHECK(!(master_weights && tp != nullptr), "DataParallelModel: master weights with tensor parallelism are not ",
               "built");
  if (sequence_parallel) {
    auto* gpt = dynamic_cast<nn::GPT*>(&model);
    TROUPE_CHECK(tp != nullptr && gpt != nullptr, "DataParallelModel: sequence parallelism needs a tensor-parallel ",
                 "GPT and its tp communicator");
    enable_sequence_parallel(*gpt, *tp);
  }
  // After DDP's broadcast, so that every rank's masters are rank 0's.
  if (master_weights) master_ = std::make_unique<MasterWeights>(model);
  optimizer_ = make_optimizer(model, master_.get());
  TROUPE_CHECK(optimizer_ != nullptr, "DataParallelModel: the optimizer factory returned none");
  if (tp != nullptr) tp_state_ = std::make_unique<TensorParallelStateDicts>(model, *optimizer_, *ddp_, *tp);
}

MicroBatchResult DataParallelModel::train_micro_batch(const Tensor& inputs, const Tensor& targets, const Loss& loss,
                                                      const MicroBatchOptions& options) {
  MicroBatchResult result;
  {
    const TraceScope span(tracer_, "compute", "forward");
    result.loss = loss.forward(ddp_->forward(inputs), targets);
  }
  result.stepped = ddp_->optimizer_step_with_gradient_accumulation(
                           *optimizer_, loss.backward, options.accum_steps, options.steps_per_epoch,
                           AccumulationOptions{.max_grad_norm = options.max_grad_norm,
                                               .master = master_.get(),
                                               .tensor_parallel = tp_,
                                               .sequence_parallel = sequence_parallel_,
                                               .tracer = tracer_})
                       .stepped;
  return result;
}

std::uint64_t DataParallelModel::parameter_hash() {
  return tp_ != nullptr ? split_parameter_hash(model_, *tp_) : nn::parameter_hash(model_);
}

nn::StateDict DataParallelModel::whole_state_dict() {
  if (tp_ != nullptr) return full_state_dict(model_, *tp_);
  return master_ ? master_->state_dict(model_) : model_.state_dict();
}

// ---- PipelineModel ----

namespace {

std::unique_ptr<OSS> stage_oss(PipelineStage& stage, collectives::Communicator& dp, const OptimizerFactory& factory,
                               Sharding sharding) {
  TROUPE_CHECK(sharding != Sharding::zero2, "PipelineModel: the data-parallel ranks of a pipeline run ddp, zero1 or ",
               "fsdp, not zero2 (a stage accumulates whole gradients over its micro-batches, so sharding them ",
               "sheds nothing until the step)");
  if (sharding == Sharding::ddp) return nullptr;
  return std::make_unique<OSS>(stage.named_parameters(), dp, factory);
}

std::vector<nn::Module*> modules(const std::vector<PipelineStage*>& chunks) { return {chunks.begin(), chunks.end()}; }

nn::Optimizer& checked(const std::unique_ptr<nn::Optimizer>& optimizer) {
  TROUPE_CHECK(optimizer != nullptr, "PipelineModel: the optimizer factory returned none");
  return *optimizer;
}

}  // namespace

PipelineModel::PipelineModel(PipelineStage& stage, collectives::Communicator& pp, collectives::Communicator& dp,
                             PipelineSchedule schedule, int micro_batches, const OptimizerFactory& factory,
                             Sharding dp_sharding, collectives::Communicator* tp)
    : stage_(stage),
      pp_(pp),
      dp_(dp),
      tp_(tp),
      fully_sharded_(dp_sharding == Sharding::fsdp),
      oss_(stage_oss(stage, dp, factory, dp_sharding)),
      optimizer_(oss_ ? nullptr : factory(stage.named_parameters())),
      pipe_(modules(stage.chunks()), pp, schedule, micro_batches),
      state_(oss_ ? PipelineStateDicts(stage, *oss_, pp, tp) : PipelineStateDicts(stage, checked(optimizer_), pp, tp)) {
  if (fully_sharded_) {
    gathering_ = std::make_unique<GatheringStateDicts>(*this);
    release_stage();
  }
}

PipelineModel::~PipelineModel() = default;

// fsdp's checkpoint groups: the stage's, read and written while it is gathered.
class PipelineModel::GatheringStateDicts final : public ShardedStateDicts {
 public:
  explicit GatheringStateDicts(PipelineModel& model) : model_(model) {}
  nn::StateDict model_state_dict() override {
    return model_.with_stage(true, [&] { return model_.state_.model_state_dict(); });
  }
  nn::StateDict optimizer_state_dict() override { return model_.state_.optimizer_state_dict(); }
  void load_model_state_dict(const nn::StateDict& dict) override {
    // Every dp rank loads the whole stage, so no values need to travel first.
    model_.with_stage(false, [&] {
      model_.state_.load_model_state_dict(dict);
      return 0;
    });
  }
  void load_optimizer_state_dict(const nn::StateDict& dict) override { model_.state_.load_optimizer_state_dict(dict); }
  std::int64_t micro_step() const override { return 0; }
  void set_micro_step(std::int64_t) override {}
  nn::StateDict whole_random_state(nn::StateDict local) override {
    return model_.state_.whole_random_state(std::move(local));
  }

 private:
  PipelineModel& model_;
};

ShardedStateDicts* PipelineModel::state_dicts() {
  if (gathering_) return gathering_.get();
  return &state_;
}

void PipelineModel::gather_stage(bool values) {
  if (!released_.empty()) {
    for (Released& r : released_) r.param->data = Tensor::empty(r.shape, r.dtype, r.device);
    released_.clear();
    if (values) oss_->share();
  }
  // After the shares: the last stage's every dp rank has the stepped table now, and the
  // first stage's is overwritten (its dp owner's stale value went out in the share).
  if (tied_stale_ && values) stage_.broadcast_tied_table(pp_);
  tied_stale_ = false;  // without values, what is loaded next sets both stages alike
}

void PipelineModel::release_stage() {
  if (!fully_sharded_ || !released_.empty()) return;
  const std::vector<int>& owners = oss_->owners();
  const std::vector<nn::NamedParameter>& params = oss_->named_parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (owners[i] == dp_.rank()) continue;
    nn::Parameter* p = params[i].param;
    released_.push_back({p, p->data.shape(), p->data.dtype(), p->data.device()});
    p->data = Tensor();
    p->grad = Tensor();
  }
}

Tensor PipelineModel::evaluate(const Tensor& inputs) {
  gather_stage();
  return pipe_.forward(inputs);
}

MicroBatchResult PipelineModel::train_micro_batch(const Tensor& inputs, const Tensor& targets, const Loss& loss,
                                                  const MicroBatchOptions& options) {
  TROUPE_CHECK(options.accum_steps == 1, "PipelineModel: accum_steps must be 1 (the pipeline's micro-batches ",
               "accumulate), got ", options.accum_steps);
  MicroBatchResult result;
  gather_stage();
  result.loss = pipe_.forward_backward(inputs, targets, loss);
  const TraceScope span(tracer_, "compute", "optimizer");
  stage_.reduce_tied_gradient(pp_);
  if (dp_.size() > 1)
    for (nn::Parameter* p : stage_.parameters())
      if (p->grad.defined()) dp_.allreduce(collectives::Buffer(p->grad), collectives::ReduceOp::avg);
  if (options.max_grad_norm > 0) pipeline_clip_grad_norm(stage_, options.max_grad_norm, pp_, tp_);
  if (fully_sharded_)
    oss_->base().step();  // the owners' values reach the others at the next gather
  else if (oss_)
    oss_->step();
  else
    optimizer_->step();
  stage_.zero_grad(true);
  if (fully_sharded_)
    tied_stale_ = true;  // the last stage's owner alone has the table until the next gather
  else
    stage_.broadcast_tied_table(pp_);
  release_stage();
  result.stepped = true;
  return result;
}

std::uint64_t PipelineModel::parameter_hash() {
  return with_stage(true, [&] {
    const std::uint64_t stage = tp_ != nullptr ? split_parameter_hash(stage_, *tp_) : nn::parameter_hash(stage_);
    return combined_hash(stage, pp_);
  });
}

nn::StateDict PipelineModel::whole_state_dict() {
  return with_stage(true, [&] { return pipeline_full_state_dict(stage_, pp_, tp_); });
}

void PipelineModel::set_tracer(Tracer* tracer) {
  tracer_ = tracer;
  pipe_.set_tracer(tracer);
}

}  // namespace troupe::parallel
