// WorkerCore's construction, layout and release (worker_core.hpp); its calls are in
// worker_calls.cpp.
#include "troupe/train/worker_core.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string_view>

#include "troupe/actors/this_call.hpp"
#include "troupe/error.hpp"
#include "troupe/supervisor/run_environment.hpp"
#include "troupe/tensor/meta.hpp"
#include "troupe/train/worker_setup.hpp"

namespace troupe::train {

namespace {
// The mesh of a tensor- or pipeline-parallel layout: null for plain data parallelism.
std::unique_ptr<parallel::DeviceMesh> worker_mesh(const WorkerOptions& options, collectives::Communicator& world) {
  TROUPE_CHECK(options.tensor_parallel >= 1 && options.pipeline_parallel >= 1,
               "TrainWorker: tensor_parallel and pipeline_parallel must be >= 1; got ", options.tensor_parallel,
               " and ", options.pipeline_parallel);
  TROUPE_CHECK(options.virtual_stages == 1 || options.pipeline_parallel > 1, "TrainWorker: virtual_stages ",
               options.virtual_stages, " without pipeline stages (pipeline_parallel 1)");
  if (options.tensor_parallel == 1 && options.pipeline_parallel == 1) return nullptr;
  // tp fastest (its all-reduces are the most frequent: consecutive ranks, one node),
  // then pp, then dp.
  std::vector<parallel::MeshDim> dims{{"dp", -1}};
  if (options.pipeline_parallel > 1) dims.push_back({"pp", options.pipeline_parallel});
  if (options.tensor_parallel > 1) dims.push_back({"tp", options.tensor_parallel});
  return std::make_unique<parallel::DeviceMesh>(world, std::move(dims));
}
}  // namespace

WorkerCore::WorkerCore(WorkerOptions options, WorkerRecipe recipe)
    : options_(std::move(options)),
      recipe_(std::move(recipe)),
      sharding_(options_.sharding),
      device_(worker_device(options_)),
      trace_(make_step_trace(options_.trace_dir, options_.trace_steps)),
      comm_(worker_communicator(options_, device_)),
      mesh_(worker_mesh(options_, *comm_)),
      model_(build_model()),
      objective_(make_objective()) {
  live_.rank = comm_->rank();
  TROUPE_CHECK(options_.eval_batch >= 1 && options_.eval_samples >= 0, "TrainWorker: eval_batch must be >= 1 and ",
               "eval_samples >= 0, got ", options_.eval_batch, " and ", options_.eval_samples);
  TROUPE_CHECK(options_.accum_steps >= 1, "TrainWorker: accum_steps must be >= 1, got ", options_.accum_steps);
  TROUPE_CHECK(options_.precision == Precision::f32 || sharding_ == Sharding::ddp,
               "TrainWorker: precision bf16 is built for ddp only, not ", parallel::sharding_name(sharding_));
  TROUPE_CHECK(!mesh_ || ((sharding_ == Sharding::ddp || sharding_ == Sharding::fsdp ||
                           (stage_ ? sharding_ == Sharding::zero1 : sharding_ == Sharding::zero2)) &&
                          options_.precision == Precision::f32),
               "TrainWorker: tensor parallelism runs with ddp, zero2 or fsdp, pipeline parallelism with ddp, ",
               "zero1 or fsdp, both in f32 for now, not ", parallel::sharding_name(sharding_), ", ",
               precision_name(options_.precision), stage_ ? " with pipeline stages" : "");
  TROUPE_CHECK(!options_.sequence_parallel ||
                   (options_.tensor_parallel > 1 && !stage_ && sharding_ == Sharding::ddp && !device_.is_cuda()),
               "TrainWorker: sequence parallelism runs over tensor_parallel > 1 ranks with ddp, no pipeline ",
               "stages and on the CPU for now, not tensor_parallel ", options_.tensor_parallel, ", ",
               parallel::sharding_name(sharding_), stage_ ? " with pipeline stages" : "", " on ",
               worker_device_name(options_.device));
  if (options_.precision == Precision::bf16) model_->to(tensor::DType::bf16);
  // Before DDP and the optimizer hold the parameters. A meta model stays described:
  // ShardedModel materialises each rank's part on device_.
  if (device_.is_cuda() && !is_meta_model()) model_->to(device_);
  // Each micro-step takes global_batch / accum_steps samples over all ranks; when the
  // ranks do not divide that, their shares differ by one and each rank's gradient is
  // weighted by its share (DistributedSampler's "uneven shares").
  TROUPE_CHECK(options_.global_batch % options_.accum_steps == 0, "TrainWorker: the global batch of ",
               options_.global_batch, " does not split into ", options_.accum_steps, " equal micro-batches");
  const std::int64_t micro_batch = options_.global_batch / options_.accum_steps;
  TROUPE_CHECK(micro_batch >= data_comm().size(), "TrainWorker: a micro-batch of ", micro_batch,
               " samples (global batch ", options_.global_batch, " / ", options_.accum_steps, ") leaves some of the ",
               data_comm().size(), " data-parallel ranks without a sample");
  if (stage_)
    TROUPE_CHECK(options_.accum_steps == 1 && micro_batch % (data_comm().size() * options_.micro_batches) == 0,
                 "TrainWorker: with pipeline parallelism, accum_steps must be 1 (the pipeline's micro-batches ",
                 "are its accumulation: raise micro_batches instead) and the global batch of ", options_.global_batch,
                 " must split into ", data_comm().size(), " data-parallel shares of ", options_.micro_batches,
                 " micro-batches");
  parallel_ = make_parallel_model();
  scheduler_ = recipe_.scheduler(optimizer());
  sampler_ = std::make_unique<DistributedSampler>(
      recipe_.train_size, data_comm().size(), data_comm().rank(),
      SamplerOptions{.shuffle = true, .seed = options_.seed, .global_batch = micro_batch});
  loader_ = std::make_unique<DataLoader<TensorBatch>>(
      *sampler_, sampler_->local_batch(),
      [this](const std::vector<std::int64_t>& idx) { return recipe_.train_rows(idx); });
  if (parallel::ShardedStateDicts* split = parallel_->state_dicts())
    state_ = std::make_unique<TrainingState>(*model_, optimizer(), *sampler_, *split);
  else
    state_ = std::make_unique<TrainingState>(*model_, optimizer(), *sampler_, parallel_->ddp(), nullptr,
                                             parallel_->master_weights());
  if (trace_) attach_tracer();
  if (trace_ && device_.is_cuda()) trace_->time_gpu();
  status_ = std::make_unique<Status>(comm_->rank() == 0 && options_.progress);
  keeper_ = std::make_unique<BestModelKeeper>(options_.best_metric, options_.best_mode,
                                              comm_->rank() == 0 ? options_.best_path : "");
  if (!options_.checkpoint_dir.empty()) {
    checkpoint_ = std::make_unique<TrainingCheckpoint>(options_.checkpoint_dir, *state_,
                                                       checkpoint::RunInfo{.run_id = options_.run_id,
                                                                           .config_json = options_.config_json,
                                                                           .world_size = comm_->size(),
                                                                           .attributes = options_.checkpoint_attributes,
                                                                           .allow_other_run = options_.allow_other_run},
                                                       comm_->rank() == 0,
                                                       static_cast<std::size_t>(std::max(1, options_.keep_last)));
  }
  // Under troupe-run: heartbeats with this rank's progress, and TROUPE_FAULT.
  const supervisor::RunEnvironment run = supervisor::run_environment();
  // Where the rank saves where troupe-run looks; not on a first launch asked to start
  // fresh, which moves the files troupe-run saw aside.
  if (run.checkpoint_dir == options_.checkpoint_dir && !(options_.fresh && run.restart == 0))
    expected_checkpoint_step_ = run.checkpoint_step;
  supervisor_ = supervisor::SupervisorClient::connect_if_supervised(run, comm_->rank(), comm_->size());
  // A hang dump lists the world communicator's last collectives (supervisor_ goes first).
  if (supervisor_) supervisor_->set_flight_recorder([comm = comm_.get()] { return comm->flight_record(); });
  if (checkpoint_) {
    // One job per folder: rank 0 holds the lock for the job (checkpoint/folder_lock.hpp).
    if (comm_->rank() == 0) folder_lock_.emplace(options_.checkpoint_dir, options_.run_id);
    if (options_.fresh && run.restart == 0) checkpoint_->start_fresh();
    checkpoint_->set_max_failed_saves(options_.max_failed_saves);
    checkpoint_->set_save_failure_handler([this](std::int64_t step, const std::string& error) {
      const std::string text = "checkpoint save of step " + std::to_string(step) + " failed: " + error;
      std::fprintf(stderr, "troupe: rank %d: %s\n", comm_->rank(), text.c_str());
      if (supervisor_) supervisor_->report_notice(supervisor::NoticeKind::save_failed, text);
    });
  }
  fault_ = supervisor::FaultInjector::from_environment(comm_->rank());
  // Called on the writing thread after each tensor: TROUPE_FAULT kind=crash_in_save
  // kills the process mid-write, and a trace gets a span per tensor written.
  if (checkpoint_ && (fault_.armed() || trace_)) {
    checkpoint_->set_write_observer([this, fault = fault_](std::int64_t step, std::string_view tensor) {
      if (fault.armed() && fault.fires_in_save(static_cast<std::uint64_t>(step))) fault.fire();
      if (Tracer* t = tracer(); t != nullptr && t->recording()) {
        t->name_this_thread("checkpoint writer");
        const std::int64_t now = Tracer::now_ns();
        t->record(TraceSpan{.name = "write " + std::string(tensor),
                            .category = "checkpoint",
                            .begin_ns = write_began_ns_.exchange(now),
                            .end_ns = now,
                            .thread = Tracer::this_thread_id(),
                            .track = {},
                            .args = "\"step\":" + std::to_string(step)});
      }
    });
  }
}

// The layout, chosen once: a pipeline stage, DDP (with f32 master weights, or over a
// tensor-parallel model), or a sharded mode (parallel_model.hpp).
std::unique_ptr<parallel::ParallelModel> WorkerCore::make_parallel_model() {
  if (stage_)
    return std::make_unique<parallel::PipelineModel>(
        *stage_, mesh_->comm("pp"), data_comm(), parallel::parse_pipeline_schedule(options_.pipeline_schedule),
        options_.micro_batches,
        recipe_.optimizer_factory(std::string(parallel::sharding_name(sharding_)) + " with pipeline stages"), sharding_,
        tensor_parallel_comm());
  if (sharding_ != Sharding::ddp) {
    parallel::FsdpOptions fsdp = recipe_.fsdp_options();
    fsdp.device = device_;  // where a meta model's shards are materialised
    return std::make_unique<parallel::ShardedModel>(sharding_, *model_, data_comm(),
                                                    recipe_.optimizer_factory(parallel::sharding_name(sharding_)),
                                                    options_.bucket_bytes, fsdp, tensor_parallel_comm());
  }
  return std::make_unique<parallel::DataParallelModel>(
      *model_, data_comm(), parallel::DdpOptions{.bucket_bytes = options_.bucket_bytes},
      [this](nn::Module& model, parallel::MasterWeights* masters) -> std::unique_ptr<nn::Optimizer> {
        if (masters) return recipe_.optimizer_factory("ddp with bf16")(masters->named_parameters());
        return recipe_.optimizer(model);
      },
      options_.precision == Precision::bf16, tensor_parallel_comm(), options_.sequence_parallel);
}
collectives::Communicator* WorkerCore::tensor_parallel_comm() const {
  return mesh_ && mesh_->has("tp") ? &mesh_->comm("tp") : nullptr;
}
std::unique_ptr<nn::Module> WorkerCore::build_model() {
  if (mesh_ && mesh_->has("pp")) {
    // Interleaved: this rank's stages s, s + p, ... of the model cut into p x v.
    const int s = mesh_->coordinate("pp"), p = mesh_->size("pp"), v = options_.virtual_stages;
    TROUPE_CHECK(v >= 1, "TrainWorker: virtual_stages must be >= 1, got ", v);
    std::unique_ptr<parallel::PipelineStage> stage;
    if (v == 1) {
      stage = recipe_.stage(s, p, tensor_parallel_comm());
    } else {
      std::vector<std::unique_ptr<parallel::PipelineStage>> chunks;
      for (int c = 0; c < v; ++c) chunks.push_back(recipe_.stage(s + c * p, p * v, tensor_parallel_comm()));
      stage = std::make_unique<parallel::InterleavedStage>(std::move(chunks));
    }
    stage_ = stage.get();
    return stage;
  }
  if (mesh_) return recipe_.tensor_parallel_model(mesh_->comm("tp"));
  return recipe_.model(sharding_ != Sharding::ddp);
}
std::unique_ptr<Objective> WorkerCore::make_objective() const {
  if (mesh_ && mesh_->has("tp")) return std::make_unique<TensorParallelCrossEntropyObjective>(mesh_->comm("tp"));
  return recipe_.objective();
}
bool WorkerCore::is_meta_model() const {
  const auto named = model_->named_parameters();
  return !named.empty() && tensor::is_meta(named.front().param->data);
}

// Gives the tracer to every communicator, the parallel wrappers, the checkpoint's
// writer thread and the actors' runtime (for its calls).
void WorkerCore::attach_tracer() {
  Tracer* t = trace_->tracer();
  comm_->set_tracer(t, "world collectives");
  if (mesh_)
    for (const auto& dim : mesh_->dims()) mesh_->comm(dim.name).set_tracer(t, dim.name + " collectives");
  parallel_->set_tracer(t);
  try {
    runtime_ = &actors::this_call::runtime();
    runtime_->set_tracer(trace_->shared_tracer());
  } catch (const InvalidArgument&) {  // built outside an actor call (a test): no actor spans
  }
}
// Releases the communicator and the model; later calls fail. Every worker must be
// stopped together (the communicator's release is collective).
void WorkerCore::stop() {
  if (stopped_) return;
  stopped_ = true;
  live_.stopped = true;
  if (runtime_) runtime_->set_tracer(nullptr);
  tensor::cuda_set_device(device_);
  // The last checkpoint is durable before we go; if it failed, the error is passed on
  // after the release below, which the other ranks' stop() calls wait for.
  std::exception_ptr unsaved;
  try {
    if (checkpoint_) checkpoint_->wait();
  } catch (const Error&) {
    unsaved = std::current_exception();
  }
  checkpoint_.reset();
  folder_lock_.reset();
  status_.reset();
  keeper_.reset();
  loader_.reset();
  state_.reset();
  parallel_.reset();
  mesh_.reset();
  comm_.reset();
  if (unsaved) std::rethrow_exception(unsaved);
}
}  // namespace troupe::train
