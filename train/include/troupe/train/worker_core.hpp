// WorkerCore: everything a TrainWorker does that does not depend on its Recipe's types
// -- the communicator and mesh, the layout (parallel::ParallelModel), the sampler and
// loader, the training loop, evaluation, checkpoints, troupe-run's heartbeats, the
// trace and the live status -- compiled once in libtroupe_train. TrainWorker<Recipe>
// (train_worker.hpp) holds the recipe's config and data sets and hands the core their
// parts as a WorkerRecipe; its actor methods forward here. See train_worker.hpp for
// what each call does and which are collectives.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/runtime.hpp"
#include "troupe/checkpoint/folder_lock.hpp"
#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/lr_scheduler.hpp"
#include "troupe/nn/module.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/parallel/device_mesh.hpp"
#include "troupe/parallel/parallel_model.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/sharded_model.hpp"
#include "troupe/supervisor/client.hpp"
#include "troupe/supervisor/fault.hpp"
#include "troupe/train/best_model_keeper.hpp"
#include "troupe/train/data_loader.hpp"
#include "troupe/train/distributed_sampler.hpp"
#include "troupe/train/objective.hpp"
#include "troupe/train/status.hpp"
#include "troupe/train/step_trace.hpp"
#include "troupe/train/tensor_dataset.hpp"
#include "troupe/train/training_checkpoint.hpp"
#include "troupe/train/training_state.hpp"
#include "troupe/train/worker_options.hpp"

namespace troupe::train {

// A recipe's parts (recipe.hpp), type-erased: TrainWorker<Recipe> fills them from its
// Recipe and Config. A factory the recipe lacks throws InvalidArgument when the layout
// that needs it asks (the recipe_* functions' messages).
struct WorkerRecipe {
  std::int64_t train_size = 0, test_size = 0;
  std::function<TensorBatch(const std::vector<std::int64_t>&rows)> train_rows, test_rows;
  std::function<std::unique_ptr<nn::Module>(bool sharded)> model;
  std::function<std::unique_ptr<nn::Module>(collectives::Communicator& tp)> tensor_parallel_model;
  std::function<std::unique_ptr<parallel::PipelineStage>(int stage, int stages, collectives::Communicator* tp)> stage;
  std::function<std::unique_ptr<Objective>()> objective;
  // An optimizer over any parameters (OSS's partition, FSDP's shards); `sharding` names
  // the layout that needs it, for the error.
  std::function<parallel::OptimizerFactory(const std::string& sharding)> optimizer_factory;
  std::function<std::unique_ptr<nn::Optimizer>(nn::Module& model)> optimizer;
  std::function<std::unique_ptr<nn::LRScheduler>(nn::Optimizer& optimizer)> scheduler;  // null: none
  std::function<parallel::FsdpOptions()> fsdp_options;
};

class WorkerCore {
 public:
  // Collective, as TrainWorker's constructor.
  WorkerCore(WorkerOptions options, WorkerRecipe recipe);
  WorkerCore(const WorkerCore&) = delete;
  WorkerCore& operator=(const WorkerCore&) = delete;

  // TrainWorker's actor methods (train_worker.hpp says what each does).
  WorkerState resume();
  void save_checkpoint();
  EpochResult train_epoch(std::int64_t epoch);
  EpochResult train_steps(std::int64_t steps);
  EvalResult evaluate();
  WorkerStatus status() const;
  WorkerState state();
  bool offer_best(double value, std::int64_t step);
  std::vector<std::pair<std::string, Tensor>> model_state();
  void stop();

  // Runs one of the collective calls above. An exception escaping it leaves this
  // rank's peers in collectives it will not enter; under troupe-run the rank first
  // drops its connection naming the error, so the job stops at once, not after the
  // hang timeout, and the failure quotes the cause (SupervisorClient::abandon).
  template <class Call>
  decltype(auto) collective(Call&& call) {
    try {
      return std::forward<Call>(call)();
    } catch (const std::exception& e) {
      if (supervisor_) supervisor_->abandon(e.what());
      throw;
    }
  }

  TrainingState& training_state();
  nn::Module& model() { return *model_; }
  Sharding sharding() const { return sharding_; }
  collectives::Communicator& communicator() { return *comm_; }
  std::int64_t parameter_count() const { return model_->parameter_count(); }

 private:
  // Construction (worker_core.cpp).
  std::unique_ptr<parallel::ParallelModel> make_parallel_model();
  std::unique_ptr<nn::Module> build_model();
  std::unique_ptr<Objective> make_objective() const;
  void attach_tracer();
  bool is_meta_model() const;
  collectives::Communicator* tensor_parallel_comm() const;
  // The ranks that split the data: the world, or the mesh's dp dimension.
  collectives::Communicator& data_comm() const { return mesh_ ? mesh_->comm("dp") : *comm_; }

  // Training (worker_calls.cpp).
  Tensor model_input(const Tensor& inputs) const;
  void start_epoch(std::int64_t epoch);
  void train_batch(const TensorBatch& batch, EpochResult& result);
  void report_progress(std::int64_t done, const EpochResult& result);
  nn::Optimizer& optimizer() { return parallel_->optimizer(); }
  template <class Result>
  void count_once(Result& result) const;
  void after_step();
  void save_on_every_rank();
  void mark_step_start();
  Tracer* tracer() const { return trace_ ? trace_->tracer() : nullptr; }
  std::chrono::nanoseconds wait_time() const;

  class CallClock;
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
    CallScope(const WorkerCore& worker, const char* what);
    ~CallScope();
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    const WorkerCore& worker_;
    const char* previous_;
  };
  // Every method starts here: a stopped worker refuses, and a running one makes its GPU
  // the current device of the pool thread that runs this call (CUDA's is per thread).
  [[nodiscard]] CallScope begin_call(const char* what) const;
  void publish_progress() const;

  WorkerOptions options_;
  WorkerRecipe recipe_;
  Sharding sharding_;
  tensor::Device device_;
  // Before the communicators, which keep a pointer to its tracer.
  std::unique_ptr<StepTrace> trace_;
  actors::Runtime* runtime_ = nullptr;  // given the tracer, when the worker was spawned
  std::unique_ptr<collectives::Communicator> comm_;
  std::unique_ptr<parallel::DeviceMesh> mesh_;  // dp x tp or dp x pp
  parallel::PipelineStage* stage_ = nullptr;    // model_, when it is a pipeline stage
  std::unique_ptr<nn::Module> model_;
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
