// TrainWorker: one actor per rank that trains its share of every batch (the Ray Train
// shape). A driver on rank 0 asks all workers at once -- train_epoch(e) or
// train_steps(n), then evaluate() -- and sees per-call sums only; gradients flow
// between the workers over their own communicator. examples/train_digits.cpp and
// examples/train_gpt.cpp are drivers; worker_driver.hpp has their common steps. One
// rank runs the same program unchanged (a single-rank communicator).
//
// The layout is chosen once, in make_parallel_model(), and the worker then trains
// through that one parallel::ParallelModel (parallel_model.hpp) whatever it is:
// WorkerOptions::sharding picks ddp, zero1 (DDP + OSS), zero2 (FSDP's shard_grad_op) or
// fsdp (sharded_model.hpp); WorkerOptions::tensor_parallel = k splits the model over k
// consecutive ranks (the recipe's make_model(config, tp)) with DDP over the world / k
// groups of them; WorkerOptions::pipeline_parallel = p cuts it into p stages (the
// recipe's make_stage) run by a pipeline schedule, the gradients averaged over the
// world / p groups; both make a dp x pp x tp mesh of stages split over tp (the
// recipe's make_stage(config, stage, stages, tp)). Checkpoints stay full, so any
// layout resumes any other's.
// Accumulation, the sampler, Status, evaluation and checkpoints work alike in every
// layout. In zero2, fsdp and the split layouts, state(), evaluate(), offer_best() and
// model_state() are collectives: ask every worker. The global batch need not divide by
// the ranks (64 over 3 is 22, 21, 21, each gradient weighted by its share).
//
// The user supplies a Recipe (recipe.hpp). The constructor is collective (it creates
// the world communicator and broadcasts rank 0's parameters), as spawn_on_each is.
// All of a worker's state that a checkpoint needs is in training_state().
#pragma once

#include <algorithm>
#include <atomic>
#include <cereal/cereal.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/actors/methods.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/actors/this_call.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/folder_lock.hpp"
#include "troupe/collectives/communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/parallel/device_mesh.hpp"
#include "troupe/parallel/parallel_model.hpp"
#include "troupe/parallel/sharded_model.hpp"
#include "troupe/supervisor/client.hpp"
#include "troupe/supervisor/fault.hpp"
#include "troupe/supervisor/run_environment.hpp"
#include "troupe/tensor/meta.hpp"
#include "troupe/tensor/serialize.hpp"
#include "troupe/train/best_model_keeper.hpp"
#include "troupe/train/data_loader.hpp"
#include "troupe/train/distributed.hpp"
#include "troupe/train/distributed_sampler.hpp"
#include "troupe/train/recipe.hpp"
#include "troupe/train/status.hpp"
#include "troupe/train/step_trace.hpp"
#include "troupe/train/tensor_dataset.hpp"
#include "troupe/train/training_checkpoint.hpp"
#include "troupe/train/training_state.hpp"
#include "troupe/train/worker_driver.hpp"
#include "troupe/train/worker_options.hpp"
#include "troupe/train/worker_setup.hpp"

namespace troupe::train {

template <class Recipe>
class TrainWorker {
 public:
  using Config = typename Recipe::Config;
  using Dataset = std::remove_cvref_t<decltype(Recipe::train_set(std::declval<const Config&>()))>;

  TrainWorker(WorkerOptions options, Config config)
      : options_(options),
        config_(std::move(config)),
        sharding_(options_.sharding),
        device_(worker_device(options_)),
        trace_(make_step_trace(options_.trace_dir, options_.trace_steps)),
        comm_(worker_communicator(options, device_)),
        mesh_(worker_mesh(options_, *comm_)),
        model_(build_model()),
        train_(Recipe::train_set(config_)),
        test_(Recipe::test_set(config_)),
        objective_(make_objective()) {
    live_.rank = comm_->rank();
    TROUPE_CHECK(options_.eval_batch >= 1 && options_.eval_samples >= 0, "TrainWorker: eval_batch must be >= 1 and ",
                 "eval_samples >= 0, got ", options_.eval_batch, " and ", options_.eval_samples);
    TROUPE_CHECK(options_.accum_steps >= 1, "TrainWorker: accum_steps must be >= 1, got ", options_.accum_steps);
    TROUPE_CHECK(options_.precision == Precision::f32 || sharding_ == Sharding::ddp,
                 "TrainWorker: precision bf16 is built for ddp only, not ", parallel::sharding_name(sharding_));
    TROUPE_CHECK(!mesh_ || ((sharding_ == Sharding::ddp ||
                             (stage_ ? sharding_ == Sharding::zero1 : sharding_ != Sharding::zero1)) &&
                            options_.precision == Precision::f32 && !device_.is_cuda()),
                 "TrainWorker: tensor parallelism runs with ddp, zero2 or fsdp, pipeline parallelism with ddp or ",
                 "zero1, both ", "in f32 and on the CPU for now, not ", parallel::sharding_name(sharding_), ", ",
                 precision_name(options_.precision), ", ", worker_device_name(options_.device),
                 stage_ ? " with pipeline stages" : "");
    TROUPE_CHECK(!options_.sequence_parallel || (options_.tensor_parallel > 1 && !stage_ && sharding_ == Sharding::ddp),
                 "TrainWorker: sequence parallelism runs over tensor_parallel > 1 ranks with ddp and no pipeline ",
                 "stages for now, not tensor_parallel ", options_.tensor_parallel, ", ",
                 parallel::sharding_name(sharding_), stage_ ? " with pipeline stages" : "");
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
    scheduler_ = recipe_scheduler<Recipe>(optimizer(), config_);
    sampler_ = std::make_unique<DistributedSampler>(
        train_.size(), data_comm().size(), data_comm().rank(),
        SamplerOptions{.shuffle = true, .seed = options_.seed, .global_batch = micro_batch});
    loader_ = std::make_unique<DataLoader<TensorBatch>>(
        *sampler_, sampler_->local_batch(), [this](const std::vector<std::int64_t>& idx) { return train_.rows(idx); });
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
      checkpoint_ = std::make_unique<TrainingCheckpoint>(
          options_.checkpoint_dir, *state_,
          checkpoint::RunInfo{.run_id = options_.run_id,
                              .config_json = options_.config_json,
                              .world_size = comm_->size(),
                              .attributes = options_.checkpoint_attributes,
                              .allow_other_run = options_.allow_other_run},
          comm_->rank() == 0, static_cast<std::size_t>(std::max(1, options_.keep_last)));
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

  // Restores the newest valid checkpoint of checkpoint_dir (every rank reads the same
  // file), so that train_epoch(state().epoch) goes on from the step after it. Returns
  // the state afterwards; step 0 when there was nothing to resume from.
  WorkerState resume() {
    const auto call = begin_call("resume");
    supervisor::PhaseScope phase(supervisor_.get(), supervisor::Phase::checkpoint_load);
    if (checkpoint_ && !checkpoint_->resume() && expected_checkpoint_step_ >= 0)
      TROUPE_THROW(checkpoint::CheckpointError, "rank ", comm_->rank(), " found no checkpoint in ",
                   options_.checkpoint_dir, ", where troupe-run saw one of step ", expected_checkpoint_step_,
                   " at this launch: this rank sees another folder (a path local to its node?). Not starting ",
                   "over from step 0");
    return state();
  }

  // Starts a checkpoint of the current state: in ddp mode rank 0 writes it in the
  // background; in the sharded modes every rank writes its own pieces into the one file
  // (the parallel save, synchronous; nothing gathered). Ask every worker.
  void save_checkpoint() {
    const auto call = begin_call("save_checkpoint");
    TROUPE_CHECK(checkpoint_, "TrainWorker::save_checkpoint: no checkpoint_dir was given");
    supervisor::PhaseScope phase(supervisor_.get(), supervisor::Phase::checkpoint_save);
    save_on_every_rank();
  }

  // Trains one epoch (or the rest of it, after a restore into the same epoch).
  EpochResult train_epoch(std::int64_t epoch) {
    const auto call = begin_call("train_epoch");
    if (state_->epoch != epoch || sampler_->exhausted() || sampler_->epoch() != epoch) start_epoch(epoch);
    const CallClock clock(*this);
    const std::int64_t micro_per_epoch = loader_->batches_per_epoch();
    EpochResult result;
    result.epoch = epoch;
    status_->begin_epoch(epoch, options_.epochs, micro_per_epoch);
    while (auto batch = clock.next_batch(result)) {
      train_batch(*batch, result);
      const std::int64_t micro = parallel_->micro_step();
      report_progress(micro == 0 ? micro_per_epoch : micro, result);
    }
    clock.finish(result);
    status_->end_progress();
    count_once(result);
    return result;
  }

  // Trains `steps` more optimizer steps from where training stands, going on into the
  // next epoch (reshuffled) whenever the sampler runs out: the step-counted loop of
  // language-model trainers, with an evaluation every so many steps between calls.
  // result.epoch is the epoch it ended in.
  EpochResult train_steps(std::int64_t steps) {
    const auto call = begin_call("train_steps");
    TROUPE_CHECK(steps >= 1, "TrainWorker::train_steps: steps must be >= 1, got ", steps);
    TROUPE_CHECK(loader_->batches_per_epoch() > 0, "TrainWorker::train_steps: the training set of ", train_.size(),
                 " samples gives no batch");
    const CallClock clock(*this);
    EpochResult result;
    status_->begin_epoch(state_->epoch, options_.epochs, steps * options_.accum_steps);
    std::int64_t micro = 0;
    while (result.steps < steps) {
      if (sampler_->exhausted()) start_epoch(state_->epoch + 1);
      auto batch = clock.next_batch(result);
      if (!batch) continue;  // the epoch ended: the next turn starts another
      train_batch(*batch, result);
      report_progress(++micro, result);
    }
    result.epoch = state_->epoch;
    clock.finish(result);
    status_->end_progress();
    count_once(result);
    return result;
  }

  // This rank's strided share of the test set (no padding: every sample once overall),
  // or of its first eval_samples.
  EvalResult evaluate() {
    const auto call = begin_call("evaluate");
    supervisor::PhaseScope phase(supervisor_.get(), supervisor::Phase::evaluation);
    model_->eval();
    EvalResult result;
    const std::int64_t total = options_.eval_samples > 0 ? std::min(options_.eval_samples, test_.size()) : test_.size();
    std::vector<std::int64_t> mine;
    for (std::int64_t i = data_comm().rank(); i < total; i += data_comm().size()) mine.push_back(i);
    const auto kBatch = static_cast<std::size_t>(options_.eval_batch);
    std::unique_ptr<Objective> objective = make_objective();
    // zero2's and fsdp's forward is a collective (it gathers), so every rank runs as many
    // batches as the largest share needs; a rank with no samples left forwards test
    // sample 0 and ignores the result.
    const bool collective = parallel_->evaluate_is_collective();
    const auto largest_share = static_cast<std::size_t>((total + comm_->size() - 1) / comm_->size());
    for (std::size_t begin = 0; begin < (collective ? largest_share : mine.size()); begin += kBatch) {
      if (begin >= mine.size()) {
        parallel_->evaluate(model_input(test_.rows(std::vector<std::int64_t>{0}).inputs));
        continue;
      }
      const std::vector<std::int64_t> idx(
          mine.begin() + static_cast<std::ptrdiff_t>(begin),
          mine.begin() + static_cast<std::ptrdiff_t>(std::min(mine.size(), begin + kBatch)));
      const TensorBatch batch = test_.rows(idx);
      const Tensor input = model_input(batch.inputs);
      const Tensor output = parallel_->evaluate(input);
      if (!output.defined()) continue;  // a pipeline stage before the last
      result.loss_sum += objective->forward(output, batch.targets) * static_cast<double>(batch.size());
      objective->add_metrics(output, batch.targets, batch.size(), result.metrics);
      result.samples += batch.size();
    }
    model_->train();
    count_once(result);
    return result;
  }

  // Answers while any other call runs (the "control" group): where this worker is.
  WorkerStatus status() const {
    WorkerStatus s;
    s.rank = live_.rank;
    s.step = live_.step;
    s.epoch = live_.epoch;
    if (const char* running = live_.running) {
      s.running = running;
      s.running_for_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch() -
                                                      std::chrono::steady_clock::duration(live_.since_ns.load()))
                            .count();
    }
    s.last_loss = live_.last_loss;
    s.stopped = live_.stopped;
    return s;
  }

  // In tensor-parallel mode a collective (the hash covers every rank's part): ask every worker.
  WorkerState state() {
    const auto call = begin_call("state");
    return {comm_->rank(),        state_->step, state_->epoch, sampler_->position(), parallel_->parameter_hash(),
            sampler_->exhausted()};
  }

  // The driver's value of the best-model metric for the current parameters: keeps a
  // copy (and writes the file) when it is the best so far. Returns whether it was.
  // Only rank 0's worker need be asked; the parameters are the same everywhere. In
  // zero2 and fsdp modes ask every worker (the model is gathered): rank 0's answer counts.
  bool offer_best(double value, std::int64_t step) {
    const auto call = begin_call("offer_best");
    nn::StateDict whole = parallel_->whole_state_dict();
    if (parallel_->whole_state_is_collective() && comm_->rank() != 0) return false;
    return keeper_->update({{options_.best_metric, value}}, whole, step);
  }

  // The model's full state dict (the f32 master weights in bf16 mode), for the driver
  // to sample from or export. In zero2 and fsdp modes it is gathered, a collective: ask
  // every worker; rank 0's answer holds it, the others' are empty.
  std::vector<std::pair<std::string, Tensor>> model_state() {
    const auto call = begin_call("model_state");
    const nn::StateDict dict = parallel_->whole_state_dict();
    if (parallel_->whole_state_is_collective() && comm_->rank() != 0) return {};
    std::vector<std::pair<std::string, Tensor>> entries;
    for (const auto& [name, value] : dict) entries.emplace_back(name, value.to(tensor::Device::cpu()).clone());
    return entries;
  }

  // Releases the communicator and the model; later calls fail. Every worker must be
  // stopped together (the communicator's release is collective).
  void stop() {
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

  // For code on this rank (a checkpoint writer): everything to save and restore.
  TrainingState& training_state() {
    const auto call = begin_call("training_state");
    return *state_;
  }
  // In fsdp mode the module's parameters are undefined between uses.
  nn::Module& model() { return *model_; }
  Sharding sharding() const { return sharding_; }
  collectives::Communicator& communicator() { return *comm_; }
  std::int64_t parameter_count() const { return model_->parameter_count(); }

  static constexpr auto troupe_methods =
      actors::methods<&TrainWorker::train_epoch, &TrainWorker::train_steps, &TrainWorker::evaluate, &TrainWorker::state,
                      &TrainWorker::offer_best, &TrainWorker::model_state, &TrainWorker::stop, &TrainWorker::resume,
                      &TrainWorker::save_checkpoint, &TrainWorker::status>;
  // Each may run a collective in some mode (see above): cancel() and deadlines refuse them.
  static constexpr auto troupe_collective =
      actors::methods<&TrainWorker::train_epoch, &TrainWorker::train_steps, &TrainWorker::evaluate, &TrainWorker::state,
                      &TrainWorker::offer_best, &TrainWorker::model_state, &TrainWorker::stop, &TrainWorker::resume,
                      &TrainWorker::save_checkpoint>;
  static constexpr auto troupe_concurrency = actors::concurrency(actors::group<1, &TrainWorker::status>("control"));

 private:
  // A batch's inputs as the model takes them: its dtype (token ids stay i64), on its device.
  Tensor model_input(const Tensor& inputs) const {
    const bool to_bf16 = options_.precision == Precision::bf16 && tensor::is_floating(inputs.dtype());
    return inputs.to(to_bf16 ? tensor::DType::bf16 : inputs.dtype()).to(device_);
  }

  void start_epoch(std::int64_t epoch) {
    sampler_->set_epoch(epoch);
    parallel_->set_micro_step(0);
    state_->epoch = epoch;
  }

  // One micro-batch: forward, the objective, backward, and the optimizer step when the
  // accumulation window closes (a pipeline's whole pass, its micro-batches inside).
  void train_batch(const TensorBatch& batch, EpochResult& result) {
    if (result.samples == 0) {
      model_->train();
      mark_step_start();
    }
    if (scheduler_) optimizer().set_lr(scheduler_->lr_at(state_->step));  // a function of the step: resumes exactly
    const auto n = batch.size();
    // This rank's share of the global batch (1 when the shares are equal).
    const double weight = sampler_->batch_weight(sampler_->position() - n, n);
    const parallel::Loss loss{[this, &result](const Tensor& output, const Tensor& targets) {
                                const double value = objective_->forward(output, targets);
                                objective_->add_metrics(output, targets, targets.size(0), result.metrics);
                                return value;
                              },
                              [this, weight](double scale) { return objective_->backward(scale * weight); }};
    // The targets stay on the host: the loss copies them.
    const parallel::MicroBatchResult step =
        parallel_->train_micro_batch(model_input(batch.inputs), batch.targets, loss,
                                     {.accum_steps = options_.accum_steps,
                                      .steps_per_epoch = loader_->batches_per_epoch(),
                                      .max_grad_norm = options_.max_grad_norm});
    live_.last_loss = step.loss;
    result.loss_sum += step.loss * static_cast<double>(n);
    result.samples += n;
    if (step.stepped) {
      ++state_->step;
      ++result.steps;
      after_step();
    }
  }

  void report_progress(std::int64_t done, const EpochResult& result) {
    status_->progress(done, result.samples * data_comm().size(),
                      {{"loss", result.loss_sum / static_cast<double>(result.samples)}});
  }

  nn::Optimizer& optimizer() { return parallel_->optimizer(); }

  // The layout, chosen once: a pipeline stage, DDP (with f32 master weights, or over a
  // tensor-parallel model), or a sharded mode (parallel_model.hpp).
  std::unique_ptr<parallel::ParallelModel> make_parallel_model() {
    if (stage_)
      return std::make_unique<parallel::PipelineModel>(
          *stage_, mesh_->comm("pp"), data_comm(), parallel::parse_pipeline_schedule(options_.pipeline_schedule),
          options_.micro_batches,
          recipe_optimizer_factory<Recipe>(config_,
                                           std::string(parallel::sharding_name(sharding_)) + " with pipeline stages"),
          sharding_, tensor_parallel_comm());
    if (sharding_ != Sharding::ddp)
      return std::make_unique<parallel::ShardedModel>(
          sharding_, *model_, data_comm(),
          recipe_optimizer_factory<Recipe>(config_, parallel::sharding_name(sharding_)), options_.bucket_bytes,
          fsdp_options(), tensor_parallel_comm());
    return std::make_unique<parallel::DataParallelModel>(
        *model_, data_comm(), parallel::DdpOptions{.bucket_bytes = options_.bucket_bytes},
        [this](nn::Module& model, parallel::MasterWeights* masters) -> std::unique_ptr<nn::Optimizer> {
          if (masters) return recipe_optimizer_factory<Recipe>(config_, "ddp with bf16")(masters->named_parameters());
          return Recipe::make_optimizer(model, config_);
        },
        options_.precision == Precision::bf16, tensor_parallel_comm(), options_.sequence_parallel);
  }

  collectives::Communicator* tensor_parallel_comm() const {
    return mesh_ && mesh_->has("tp") ? &mesh_->comm("tp") : nullptr;
  }

  // The ranks that split the data: the world, or the mesh's dp dimension.
  collectives::Communicator& data_comm() const { return mesh_ ? mesh_->comm("dp") : *comm_; }

  static std::unique_ptr<parallel::DeviceMesh> worker_mesh(const WorkerOptions& options,
                                                           collectives::Communicator& world) {
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

  std::unique_ptr<nn::Module> build_model() {
    if (mesh_ && mesh_->has("pp")) {
      // Interleaved: this rank's stages s, s + p, ... of the model cut into p x v.
      const int s = mesh_->coordinate("pp"), p = mesh_->size("pp"), v = options_.virtual_stages;
      TROUPE_CHECK(v >= 1, "TrainWorker: virtual_stages must be >= 1, got ", v);
      std::unique_ptr<parallel::PipelineStage> stage;
      if (v == 1) {
        stage = recipe_pipeline_stage<Recipe>(config_, s, p, tensor_parallel_comm());
      } else {
        std::vector<std::unique_ptr<parallel::PipelineStage>> chunks;
        for (int c = 0; c < v; ++c)
          chunks.push_back(recipe_pipeline_stage<Recipe>(config_, s + c * p, p * v, tensor_parallel_comm()));
        stage = std::make_unique<parallel::InterleavedStage>(std::move(chunks));
      }
      stage_ = stage.get();
      return stage;
    }
    if (mesh_) return recipe_tensor_parallel_model<Recipe>(config_, mesh_->comm("tp"));
    return recipe_model<Recipe>(config_, sharding_ != Sharding::ddp);
  }

  std::unique_ptr<Objective> make_objective() const {
    if (mesh_ && mesh_->has("tp")) return std::make_unique<TensorParallelCrossEntropyObjective>(mesh_->comm("tp"));
    return recipe_objective<Recipe>(config_);
  }

  // A tp or pp group's ranks hold one model and see the same samples: only one rank's
  // sums count (tp's first; pp's last, which computes the loss), so the driver's totals
  // are the data-parallel ones.
  template <class Result>
  void count_once(Result& result) const {
    if (parallel_->counts_results()) return;
    result.loss_sum = 0;
    result.samples = 0;
    result.metrics.clear();
  }

  // After every optimizer step: progress for troupe-run, the injected fault if this is
  // its step, and the periodic checkpoint (every rank calls it; see save_checkpoint).
  void after_step() {
    publish_progress();
    const auto step = static_cast<std::uint64_t>(state_->step);
    if (supervisor_) {
      supervisor_->report_step(step);
      supervisor_->report_collective(comm_->next_sequence());
      const auto wall = std::chrono::steady_clock::now() - step_started_;
      supervisor_->report_step_work(std::chrono::duration_cast<std::chrono::nanoseconds>(wall) -
                                    (wait_time() - step_wait_started_));
    }
    fault_.at_step(step);
    if (checkpoint_ && options_.save_every > 0 && state_->step % options_.save_every == 0) {
      supervisor::PhaseScope phase(supervisor_.get(), supervisor::Phase::checkpoint_save);
      const auto started = std::chrono::steady_clock::now();
      {
        const TraceScope span(tracer(), "checkpoint", "checkpoint snapshot");
        save_on_every_rank();
      }
      checkpoint_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      write_began_ns_ = Tracer::now_ns();
    }
    if (trace_) trace_->step_ends(state_->step);
    mark_step_start();  // a save is not a step's work
  }

  // Every rank calls save(); when the writer gives up on the run (its saves failed too
  // often in a row, TrainingCheckpoint) every rank stops with it. In ddp mode only the
  // writer knows, so the ranks agree on it: otherwise the others would wait for it in
  // the next step's collectives until their timeout. Sharded saves fail everywhere at once.
  void save_on_every_rank() {
    std::exception_ptr failed;
    try {
      checkpoint_->save(state_->step, state_->epoch);
    } catch (const Error&) {  // any of troupe's: the others must not wait for this rank
      failed = std::current_exception();
    }
    if (!state_->has_local_state_slices()) {
      Tensor flag = Tensor::full({1}, failed ? 1.0 : 0.0, tensor::DType::f32, device_);
      comm_->allreduce(flag, collectives::ReduceOp::max);
      if (!failed && flag.to(tensor::Device::cpu()).item() > 0)
        TROUPE_THROW(checkpoint::CheckpointError, "rank ", comm_->rank(),
                     " stops with the checkpoint writer (rank 0), ",
                     "whose save failed (its log says why); the last durable checkpoint stays");
    }
    if (failed) std::rethrow_exception(failed);
  }

  // A training call's clock: its wall time, and of that the waits in the world
  // communicator's collectives, the batches' fetching and the periodic saves
  // (EpochResult, time_shares).
  class CallClock {
   public:
    explicit CallClock(TrainWorker& worker)
        : worker_(worker),
          start_(std::chrono::steady_clock::now()),
          wait_(worker.wait_time()),
          checkpoint_(worker.checkpoint_seconds_) {}
    auto next_batch(EpochResult& result) const {
      const auto before = std::chrono::steady_clock::now();
      const TraceScope span(worker_.tracer(), "data", "data");
      auto batch = worker_.loader_->next();
      result.data_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
      return batch;
    }
    void finish(EpochResult& result) const {
      if (worker_.trace_) worker_.trace_->call_ends();
      result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      result.wait_seconds = std::chrono::duration<double>(worker_.wait_time() - wait_).count();
      result.checkpoint_seconds = worker_.checkpoint_seconds_ - checkpoint_;
    }

   private:
    TrainWorker& worker_;
    std::chrono::steady_clock::time_point start_;
    std::chrono::nanoseconds wait_;
    double checkpoint_;
  };

  void mark_step_start() {
    step_started_ = std::chrono::steady_clock::now();
    step_wait_started_ = wait_time();
    if (trace_) trace_->step_begins(state_->step + 1);
  }

  Tracer* tracer() const { return trace_ ? trace_->tracer() : nullptr; }

  // This rank's time blocked on collectives not yet done, on every communicator it
  // trains over: the world, the mesh's dimensions, the pipeline's links.
  std::chrono::nanoseconds wait_time() const {
    std::chrono::nanoseconds waited = comm_->wait_time();
    if (mesh_)
      for (const auto& dim : mesh_->dims()) waited += mesh_->comm(dim.name).wait_time();
    if (parallel_) waited += parallel_->wait_time();
    return waited;
  }

  // Gives the tracer to every communicator, the parallel wrappers, the checkpoint's
  // writer thread and the actors' runtime (for its calls).
  void attach_tracer() {
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

  // Every method starts here: a stopped worker refuses, and a running one makes its GPU
  // the current device of the pool thread that runs this call (CUDA's is per thread).
  bool is_meta_model() const {
    const auto named = model_->named_parameters();
    return !named.empty() && tensor::is_meta(named.front().param->data);
  }
  parallel::FsdpOptions fsdp_options() const {
    parallel::FsdpOptions fsdp = recipe_fsdp_options<Recipe>(config_);
    fsdp.device = device_;  // where a meta model's shards are materialised
    return fsdp;
  }

  // What status() reads from another thread while a call runs.
  struct Live {
    std::int32_t rank = 0;
    std::atomic<std::int64_t> step{0}, epoch{0};
    std::atomic<const char*> running{nullptr};
    std::atomic<std::int64_t> since_ns{0};  // steady_clock, when `running` began
    std::atomic<double> last_loss{0};
    std::atomic<bool> stopped{false};
  };
  // Marks a public call running for status(), and publishes the step when it ends.
  class CallScope {
   public:
    CallScope(const TrainWorker& worker, const char* what)
        : worker_(worker), previous_(worker.live_.running.exchange(what)) {
      if (previous_ == nullptr) worker_.live_.since_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    }
    ~CallScope() {
      worker_.publish_progress();
      worker_.live_.running = previous_;
    }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    const TrainWorker& worker_;
    const char* previous_;
  };
  [[nodiscard]] CallScope begin_call(const char* what) const {
    TROUPE_CHECK(!stopped_, "TrainWorker::", what, ": the worker was stopped");
    tensor::cuda_set_device(device_);
    return CallScope(*this, what);
  }
  void publish_progress() const {
    if (!state_) return;
    live_.step = state_->step;
    live_.epoch = state_->epoch;
  }

  WorkerOptions options_;
  Config config_;
  Sharding sharding_;
  tensor::Device device_;
  // Before the communicators, which keep a pointer to its tracer.
  std::unique_ptr<StepTrace> trace_;
  actors::Runtime* runtime_ = nullptr;  // given the tracer, when the worker was spawned
  std::unique_ptr<collectives::Communicator> comm_;
  std::unique_ptr<parallel::DeviceMesh> mesh_;  // dp x tp or dp x pp
  parallel::PipelineStage* stage_ = nullptr;    // model_, when it is a pipeline stage
  std::unique_ptr<nn::Module> model_;
  Dataset train_, test_;
  std::unique_ptr<Objective> objective_;
  std::unique_ptr<parallel::ParallelModel> parallel_;  // the layout: DDP, sharded, or a pipeline stage
  std::unique_ptr<nn::LRScheduler> scheduler_;         // the recipe's, if any: sets the lr before each step
  std::unique_ptr<DistributedSampler> sampler_;
  std::unique_ptr<DataLoader<TensorBatch>> loader_;
  std::unique_ptr<TrainingState> state_;
  std::unique_ptr<Status> status_;
  std::unique_ptr<BestModelKeeper> keeper_;
  // Rank 0's lock of checkpoint_dir: declared first, so it outlives the save in flight.
  std::optional<checkpoint::FolderLock> folder_lock_;
  std::unique_ptr<TrainingCheckpoint> checkpoint_;
  std::unique_ptr<supervisor::SupervisorClient> supervisor_;
  supervisor::FaultInjector fault_;
  long long expected_checkpoint_step_ = -1;  // TROUPE_CHECKPOINT_STEP, where it applies
  bool stopped_ = false;
  mutable Live live_;
  // Where the current step began, and the communicator's wait time then (after_step).
  std::chrono::steady_clock::time_point step_started_{};
  double checkpoint_seconds_ = 0;  // in periodic saves (save_every), for CallClock
  std::chrono::nanoseconds step_wait_started_{};
  std::atomic<std::int64_t> write_began_ns_{0};  // the last snapshot's end: its write's start, for the trace
};

}  // namespace troupe::train
