// WorkerCore's calls: training, evaluation, checkpoints and the live status
// (worker_core.hpp).
#include <algorithm>
#include <chrono>
#include <exception>

#include "troupe/checkpoint/error.hpp"
#include "troupe/error.hpp"
#include "troupe/train/worker_core.hpp"

namespace troupe::train {

// A training call's clock: its wall time, and of that the waits in the world
// communicator's collectives, the batches' fetching and the periodic saves
// (EpochResult, time_shares).
class WorkerCore::CallClock {
 public:
  explicit CallClock(WorkerCore& worker)
      : worker_(worker),
        start_(std::chrono::steady_clock::now()),
        wait_(worker.wait_time()),
        checkpoint_(worker.checkpoint_seconds_) {}
  std::optional<TensorBatch> next_batch(EpochResult& result) const {
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
  WorkerCore& worker_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::nanoseconds wait_;
  double checkpoint_;
};

// A tp or pp group's ranks hold one model and see the same samples: only one rank's
// sums count (tp's first; pp's last, which computes the loss), so the driver's totals
// are the data-parallel ones.
template <class Result>
void WorkerCore::count_once(Result& result) const {
  if (parallel_->counts_results()) return;
  result.loss_sum = 0;
  result.samples = 0;
  result.metrics.clear();
}

WorkerCore::CallScope::CallScope(const WorkerCore& worker, const char* what)
    : worker_(worker), previous_(worker.live_.running.exchange(what)) {
  if (previous_ == nullptr) worker_.live_.since_ns = std::chrono::steady_clock::now().time_since_epoch().count();
}

WorkerCore::CallScope::~CallScope() {
  worker_.publish_progress();
  worker_.live_.running = previous_;
}

WorkerCore::CallScope WorkerCore::begin_call(const char* what) const {
  TROUPE_CHECK(!stopped_, "TrainWorker::", what, ": the worker was stopped");
  tensor::cuda_set_device(device_);
  return CallScope(*this, what);
}

void WorkerCore::publish_progress() const {
  if (!state_) return;
  live_.step = state_->step;
  live_.epoch = state_->epoch;
}

// Restores the newest valid checkpoint of checkpoint_dir (every rank reads the same
// file), so that train_epoch(state().epoch) goes on from the step after it. Returns
// the state afterwards; step 0 when there was nothing to resume from.
WorkerState WorkerCore::resume() {
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
void WorkerCore::save_checkpoint() {
  const auto call = begin_call("save_checkpoint");
  TROUPE_CHECK(checkpoint_, "TrainWorker::save_checkpoint: no checkpoint_dir was given");
  supervisor::PhaseScope phase(supervisor_.get(), supervisor::Phase::checkpoint_save);
  save_on_every_rank();
}
// Trains one epoch (or the rest of it, after a restore into the same epoch).
EpochResult WorkerCore::train_epoch(std::int64_t epoch) {
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
EpochResult WorkerCore::train_steps(std::int64_t steps) {
  const auto call = begin_call("train_steps");
  TROUPE_CHECK(steps >= 1, "TrainWorker::train_steps: steps must be >= 1, got ", steps);
  TROUPE_CHECK(loader_->batches_per_epoch() > 0, "TrainWorker::train_steps: the training set of ", recipe_.train_size,
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
EvalResult WorkerCore::evaluate() {
  const auto call = begin_call("evaluate");
  supervisor::PhaseScope phase(supervisor_.get(), supervisor::Phase::evaluation);
  model_->eval();
  EvalResult result;
  const std::int64_t total =
      options_.eval_samples > 0 ? std::min(options_.eval_samples, recipe_.test_size) : recipe_.test_size;
  std::vector<std::int64_t> mine;
  for (std::int64_t i = data_comm().rank(); i < total; i += data_comm().size()) mine.push_back(i);
  const auto kBatch = static_cast<std::size_t>(options_.eval_batch);
  std::unique_ptr<Objective> objective = make_objective();
  // zero2's and fsdp's forward is a collective (it gathers), so every rank runs as many
  // batches as the largest share needs; a rank with no samples left forwards test
  // sample 0 and ignores the result.
  const bool collective = parallel_->evaluate_is_collective();
  const auto largest_share = static_cast<std::size_t>((total + data_comm().size() - 1) / data_comm().size());
  for (std::size_t begin = 0; begin < (collective ? largest_share : mine.size()); begin += kBatch) {
    if (begin >= mine.size()) {
      parallel_->evaluate(model_input(recipe_.test_rows(std::vector<std::int64_t>{0}).inputs));
      continue;
    }
    const std::vector<std::int64_t> idx(
        mine.begin() + static_cast<std::ptrdiff_t>(begin),
        mine.begin() + static_cast<std::ptrdiff_t>(std::min(mine.size(), begin + kBatch)));
    const TensorBatch batch = recipe_.test_rows(idx);
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
WorkerStatus WorkerCore::status() const {
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
WorkerState WorkerCore::state() {
  const auto call = begin_call("state");
  return {comm_->rank(),        state_->step, state_->epoch, sampler_->position(), parallel_->parameter_hash(),
          sampler_->exhausted()};
}
// The driver's value of the best-model metric for the current parameters: keeps a
// copy (and writes the file) when it is the best so far. Returns whether it was.
// Only rank 0's worker need be asked; the parameters are the same everywhere. In
// zero2 and fsdp modes ask every worker (the model is gathered): rank 0's answer counts.
bool WorkerCore::offer_best(double value, std::int64_t step) {
  const auto call = begin_call("offer_best");
  nn::StateDict whole = parallel_->whole_state_dict();
  if (parallel_->whole_state_is_collective() && comm_->rank() != 0) return false;
  return keeper_->update({{options_.best_metric, value}}, whole, step);
}
// The model's full state dict (the f32 master weights in bf16 mode), for the driver
// to sample from or export. In zero2 and fsdp modes it is gathered, a collective: ask
// every worker; rank 0's answer holds it, the others' are empty.
std::vector<std::pair<std::string, Tensor>> WorkerCore::model_state() {
  const auto call = begin_call("model_state");
  const nn::StateDict dict = parallel_->whole_state_dict();
  if (parallel_->whole_state_is_collective() && comm_->rank() != 0) return {};
  std::vector<std::pair<std::string, Tensor>> entries;
  for (const auto& [name, value] : dict) entries.emplace_back(name, value.to(tensor::Device::cpu()).clone());
  return entries;
}
// For code on this rank (a checkpoint writer): everything to save and restore.
TrainingState& WorkerCore::training_state() {
  const auto call = begin_call("training_state");
  return *state_;
}
// A batch's inputs as the model takes them: its dtype (token ids stay i64), on its device.
Tensor WorkerCore::model_input(const Tensor& inputs) const {
  const bool to_bf16 = options_.precision == Precision::bf16 && tensor::is_floating(inputs.dtype());
  return inputs.to(to_bf16 ? tensor::DType::bf16 : inputs.dtype()).to(device_);
}
void WorkerCore::start_epoch(std::int64_t epoch) {
  sampler_->set_epoch(epoch);
  parallel_->set_micro_step(0);
  state_->epoch = epoch;
}
// One micro-batch: forward, the objective, backward, and the optimizer step when the
// accumulation window closes (a pipeline's whole pass, its micro-batches inside).
void WorkerCore::train_batch(const TensorBatch& batch, EpochResult& result) {
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
  const parallel::MicroBatchResult step = parallel_->train_micro_batch(model_input(batch.inputs), batch.targets, loss,
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
void WorkerCore::report_progress(std::int64_t done, const EpochResult& result) {
  status_->progress(done, result.samples * data_comm().size(),
                    {{"loss", result.loss_sum / static_cast<double>(result.samples)}});
}
// After every optimizer step: progress for troupe-run, the injected fault if this is
// its step, and the periodic checkpoint (every rank calls it; see save_checkpoint).
void WorkerCore::after_step() {
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
void WorkerCore::save_on_every_rank() {
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
      TROUPE_THROW(checkpoint::CheckpointError, "rank ", comm_->rank(), " stops with the checkpoint writer (rank 0), ",
                   "whose save failed (its log says why); the last durable checkpoint stays");
  }
  if (failed) std::rethrow_exception(failed);
}
void WorkerCore::mark_step_start() {
  step_started_ = std::chrono::steady_clock::now();
  step_wait_started_ = wait_time();
  if (trace_) trace_->step_begins(state_->step + 1);
}
// This rank's time blocked on collectives not yet done, on every communicator it
// trains over: the world, the mesh's dimensions, the pipeline's links.
std::chrono::nanoseconds WorkerCore::wait_time() const {
  std::chrono::nanoseconds waited = comm_->wait_time();
  if (mesh_)
    for (const auto& dim : mesh_->dims()) waited += mesh_->comm(dim.name).wait_time();
  if (parallel_) waited += parallel_->wait_time();
  return waited;
}
}  // namespace troupe::train
