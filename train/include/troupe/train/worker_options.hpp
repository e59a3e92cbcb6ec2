// What a TrainWorker is given (WorkerOptions, sent to every rank) and what it answers
// (EpochResult, EvalResult, WorkerState): plain serialisable values, see train_worker.hpp.
#pragma once

#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/parallel/sharding.hpp"
#include "troupe/train/objective.hpp"

namespace troupe::train {

using parallel::Sharding;  // the worker's mode (troupe/parallel/sharding.hpp)
// Where a worker computes: the CPU, or this rank's GPU (its local rank modulo the GPUs
// it sees), the gradients (and the sharded modes' gathers) over NCCL and host-side
// values (norms, state-dict metadata) over MPI beside it.
enum class WorkerDevice { cpu, cuda };
// f32, or bf16 mixed precision: a bf16 model (products and gradients in bf16, f32
// accumulation) stepping f32 master weights (master_weights.hpp), which the checkpoints
// keep, so a resume is exact. ddp only.
enum class Precision { f32, bf16 };

// From the names a command line uses ("cpu", "cuda"; "f32", "bf16"); anything else is
// an InvalidArgument listing them. (parse_sharding: troupe/parallel/sharding.hpp.)
WorkerDevice parse_worker_device(std::string_view name);
Precision parse_precision(std::string_view name);
const char* worker_device_name(WorkerDevice device);
const char* precision_name(Precision precision);

// What every worker needs besides the recipe's config; sent to every rank.
struct WorkerOptions {
  std::int64_t global_batch = 64;  // samples per optimizer step over all ranks
  std::int32_t accum_steps = 1;    // micro-batches per step on each rank
  std::uint64_t seed = 0;          // the sampler's shuffle seed
  std::uint64_t bucket_bytes = std::uint64_t{25} << 20;
  Sharding sharding = Sharding::ddp;
  // Ranks each model is split over (tensor parallelism; 1: none). The world becomes a
  // dp x tp mesh, tp ranks consecutive; the sharding mode (ddp, zero2 or fsdp) runs over
  // dp, sharding each part. f32, CPU only for now.
  std::int32_t tensor_parallel = 1;
  // Megatron's sequence parallelism over tp (tensor_parallel.hpp): between the tp layers
  // each rank holds 1/tp of every sequence's positions. Sharding ddp, no pipeline
  // stages; sequences must split into tp equal parts.
  bool sequence_parallel = false;
  // Pipeline stages (1: none): the world becomes a dp x pp mesh and each step is one
  // pass of the schedule ("gpipe", "1f1b" or "interleaved") over micro_batches
  // micro-batches (interleaved: virtual_stages >= 2 stages a rank, the model cut into
  // pipeline_parallel x virtual_stages; micro_batches a multiple of pp), the
  // gradients then averaged over dp (sharding ddp, or zero1: each stage's optimizer
  // state sharded over dp). f32, CPU, accum_steps 1. With tensor_parallel too, a dp x
  // pp x tp mesh: each stage split over tp.
  std::int32_t pipeline_parallel = 1;
  std::string pipeline_schedule = "1f1b";
  std::int32_t micro_batches = 4;
  std::int32_t virtual_stages = 1;
  WorkerDevice device = WorkerDevice::cpu;
  // How a cuda worker's collectives travel: "nccl" (empty: the default), or "mpi",
  // staged through host memory (troupe/collectives/staged_communicator.hpp), for ranks
  // that share a GPU, which NCCL refuses. A cpu worker's are MPI's ("mpi" or empty).
  std::string backend;
  Precision precision = Precision::f32;
  double max_grad_norm = 0;  // 0: no clipping
  std::int32_t epochs = 1;   // for the progress bar only
  bool progress = true;      // draw progress on rank 0
  // How long a collective may wait for the other ranks. A worker that fails on one
  // rank leaves the others waiting in an all-reduce: this bounds the wait, and the
  // TimeoutError names the collective, instead of a silent hang.
  double collective_timeout_s = 120;
  // The best model by the driver's metric (offer_best), kept by rank 0's worker and
  // written to `best_path` when set; `best_mode` is "min" or "max".
  std::string best_metric = "test_accuracy";
  std::string best_mode = "max";
  std::string best_path{};
  // Checkpoints (training_checkpoint.hpp): the folder (empty: none), a save every
  // `save_every` optimizer steps (0: only when the driver asks, save_checkpoint), how
  // many to keep, and what the files' root attributes record.
  std::string checkpoint_dir;
  std::int64_t save_every = 0;
  std::int32_t keep_last = 3;
  std::string run_id;
  std::string config_json = "{}";
  // More string attributes for every checkpoint's root (a tokenizer's vocabulary):
  // a checkpoint that records one of them with another value is refused at resume.
  std::vector<std::pair<std::string, std::string>> checkpoint_attributes{};
  // Start over in a folder that holds an earlier run's checkpoints, moving them aside
  // (superseded-*/) on the first launch only: a relaunch by troupe-run resumes as usual.
  // Without it, a folder with checkpoints of which none is usable is an error.
  bool fresh = false;
  // Resume a checkpoint whose identity attributes (checkpoint_attributes) differ from
  // this run's, with a warning, instead of refusing it.
  bool allow_other_run = false;
  // Failed saves in a row after which training stops (0: never); see TrainingCheckpoint.
  std::int32_t max_failed_saves = 2;
  // Evaluation: samples per forward, and at most this many test samples (0: all),
  // the same first ones every time (nanoGPT's eval_iters).
  std::int64_t eval_batch = 256;
  std::int64_t eval_samples = 0;
  // A timeline of steps `trace_steps` ("FIRST-LAST", inclusive; empty: 3-5) written to
  // trace_dir/trace.json (step_trace.hpp). Empty: troupe-run's --trace, if any.
  std::string trace_dir;
  std::string trace_steps;

  template <class A>
  void serialize(A& a) {
    a(global_batch, accum_steps, seed, bucket_bytes, max_grad_norm, epochs, progress, collective_timeout_s, best_metric,
      best_mode, best_path, checkpoint_dir, save_every, keep_last, run_id, config_json, sharding, device, precision,
      checkpoint_attributes, fresh, allow_other_run, max_failed_saves, eval_batch, eval_samples, tensor_parallel,
      pipeline_parallel, pipeline_schedule, micro_batches, trace_dir, trace_steps, sequence_parallel, virtual_stages,
      backend);
  }
};

// One rank's sums over an epoch (the driver adds them up).
struct EpochResult {
  std::int64_t epoch = 0;
  double loss_sum = 0;  // per-sample loss summed
  MetricSums metrics;   // the objective's sums over samples ("correct", ...)
  std::int64_t samples = 0;
  std::int64_t steps = 0;  // optimizer steps taken in this call
  double seconds = 0;
  // Of `seconds`, this rank's time waiting for peers in collectives, fetching batches
  // and in checkpoint saves (save_every); the rest is compute (time_shares).
  double wait_seconds = 0, data_seconds = 0, checkpoint_seconds = 0;
  double metric(const std::string& name) const { return metrics.contains(name) ? metrics.at(name) : 0.0; }
  template <class A>
  void serialize(A& a) {
    a(epoch, loss_sum, metrics, samples, steps, seconds, wait_seconds, data_seconds, checkpoint_seconds);
  }
};

// Where the ranks' training time went, summed over `results` (one a rank): shares of
// "compute", "comm_wait", "data" and "checkpoint", as "<name>_share" metrics that add
// up to 1, for Status::log.
std::vector<std::pair<std::string, double>> time_shares(const std::vector<EpochResult>& results);

struct EvalResult {
  double loss_sum = 0;
  MetricSums metrics;
  std::int64_t samples = 0;
  double metric(const std::string& name) const { return metrics.contains(name) ? metrics.at(name) : 0.0; }
  template <class A>
  void serialize(A& a) {
    a(loss_sum, metrics, samples);
  }
};

struct WorkerState {
  std::int32_t rank = 0;
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t sampler_position = 0;
  std::uint64_t parameter_hash = 0;  // FNV-1a of every parameter's bytes: equal on all ranks
  bool epoch_finished = false;       // the sampler has handed out all of `epoch`
  template <class A>
  void serialize(A& a) {
    a(rank, step, epoch, sampler_position, parameter_hash, epoch_finished);
  }
};

// What TrainWorker::status() says while the worker runs: it answers at once, during
// train_epoch too (its own concurrency group), from values the training loop
// publishes after every optimizer step. Not a collective: ask any worker.
struct WorkerStatus {
  std::int32_t rank = 0;
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::string running;       // the worker's call running now ("train_epoch"), or empty
  double running_for_s = 0;  // since it began
  double last_loss = 0;      // the loss of the last micro-batch trained (0 before any)
  bool stopped = false;
  template <class A>
  void serialize(A& a) {
    a(rank, step, epoch, running, running_for_s, last_loss, stopped);
  }
};

}  // namespace troupe::train
