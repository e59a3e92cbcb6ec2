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
//
// This template holds only the recipe's config and data sets; the rest, which does not
// depend on the recipe's types, is WorkerCore (worker_core.hpp), compiled once.
#pragma once

#include <cereal/cereal.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/actors/methods.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/tensor/serialize.hpp"
#include "troupe/train/distributed.hpp"
#include "troupe/train/recipe.hpp"
#include "troupe/train/worker_core.hpp"
#include "troupe/train/worker_driver.hpp"
#include "troupe/train/worker_options.hpp"

namespace troupe::train {

template <class Recipe>
class TrainWorker {
 public:
  using Config = typename Recipe::Config;
  using Dataset = std::remove_cvref_t<decltype(Recipe::train_set(std::declval<const Config&>()))>;

  TrainWorker(WorkerOptions options, Config config)
      : config_(std::move(config)),
        train_(Recipe::train_set(config_)),
        test_(Recipe::test_set(config_)),
        core_(std::move(options), recipe()) {}

  // Restores the newest valid checkpoint of checkpoint_dir (every rank reads the same
  // file), so that train_epoch(state().epoch) goes on from the step after it. Returns
  // the state afterwards; step 0 when there was nothing to resume from.
  WorkerState resume() {
    return core_.collective([&] { return core_.resume(); });
  }
  // Starts a checkpoint of the current state: in ddp mode rank 0 writes it in the
  // background; in the sharded modes every rank writes its own pieces into the one file
  // (the parallel save, synchronous; nothing gathered). Ask every worker.
  void save_checkpoint() {
    core_.collective([&] { core_.save_checkpoint(); });
  }
  // Trains one epoch (or the rest of it, after a restore into the same epoch).
  EpochResult train_epoch(std::int64_t epoch) {
    return core_.collective([&] { return core_.train_epoch(epoch); });
  }
  // Trains `steps` more optimizer steps from where training stands, going on into the
  // next epoch (reshuffled) whenever the sampler runs out: the step-counted loop of
  // language-model trainers, with an evaluation every so many steps between calls.
  // result.epoch is the epoch it ended in.
  EpochResult train_steps(std::int64_t steps) {
    return core_.collective([&] { return core_.train_steps(steps); });
  }
  // This rank's strided share of the test set (no padding: every sample once overall),
  // or of its first eval_samples.
  EvalResult evaluate() {
    return core_.collective([&] { return core_.evaluate(); });
  }
  // Answers while any other call runs (the "control" group): where this worker is.
  WorkerStatus status() const { return core_.status(); }
  // In tensor-parallel mode a collective (the hash covers every rank's part): ask every worker.
  WorkerState state() {
    return core_.collective([&] { return core_.state(); });
  }
  // The driver's value of the best-model metric for the current parameters: keeps a
  // copy (and writes the file) when it is the best so far. Returns whether it was.
  // Only rank 0's worker need be asked; the parameters are the same everywhere. In
  // zero2 and fsdp modes ask every worker (the model is gathered): rank 0's answer counts.
  bool offer_best(double value, std::int64_t step) {
    return core_.collective([&] { return core_.offer_best(value, step); });
  }
  // The model's full state dict (the f32 master weights in bf16 mode), for the driver
  // to sample from or export. In zero2 and fsdp modes it is gathered, a collective: ask
  // every worker; rank 0's answer holds it, the others' are empty.
  std::vector<std::pair<std::string, Tensor>> model_state() {
    return core_.collective([&] { return core_.model_state(); });
  }
  // Releases the communicator and the model; later calls fail. Every worker must be
  // stopped together (the communicator's release is collective).
  void stop() {
    core_.collective([&] { core_.stop(); });
  }

  // For code on this rank (a checkpoint writer): everything to save and restore.
  TrainingState& training_state() { return core_.training_state(); }
  // In fsdp mode the module's parameters are undefined between uses.
  nn::Module& model() { return core_.model(); }
  Sharding sharding() const { return core_.sharding(); }
  collectives::Communicator& communicator() { return core_.communicator(); }
  std::int64_t parameter_count() const { return core_.parameter_count(); }

  static constexpr auto troupe_methods =
      actors::methods<&TrainWorker::train_epoch, &TrainWorker::train_steps, &TrainWorker::evaluate, &TrainWorker::state,
                      &TrainWorker::offer_best, &TrainWorker::model_state, &TrainWorker::stop, &TrainWorker::resume,
                      &TrainWorker::save_checkpoint, &TrainWorker::status>;
  // Each may run a collective in some mode (see above): cancel() and deadlines refuse them,
  // and each runs through core_.collective (an exception stops the job under troupe-run).
  static constexpr auto troupe_collective =
      actors::methods<&TrainWorker::train_epoch, &TrainWorker::train_steps, &TrainWorker::evaluate, &TrainWorker::state,
                      &TrainWorker::offer_best, &TrainWorker::model_state, &TrainWorker::stop, &TrainWorker::resume,
                      &TrainWorker::save_checkpoint>;
  static constexpr auto troupe_concurrency = actors::concurrency(actors::group<1, &TrainWorker::status>("control"));

 private:
  // The recipe's parts for the core; they use config_, train_ and test_, which live as
  // long as the core (declared before it).
  WorkerRecipe recipe() {
    WorkerRecipe r;
    r.train_size = train_.size();
    r.test_size = test_.size();
    r.train_rows = [this](const std::vector<std::int64_t>& rows) { return train_.rows(rows); };
    r.test_rows = [this](const std::vector<std::int64_t>& rows) { return test_.rows(rows); };
    r.model = [this](bool sharded) { return recipe_model<Recipe>(config_, sharded); };
    r.tensor_parallel_model = [this](collectives::Communicator& tp) {
      return recipe_tensor_parallel_model<Recipe>(config_, tp);
    };
    r.stage = [this](int stage, int stages, collectives::Communicator* tp) {
      return recipe_pipeline_stage<Recipe>(config_, stage, stages, tp);
    };
    r.objective = [this] { return recipe_objective<Recipe>(config_); };
    r.optimizer_factory = [this](const std::string& sharding) {
      return recipe_optimizer_factory<Recipe>(config_, sharding);
    };
    r.optimizer = [this](nn::Module& model) { return Recipe::make_optimizer(model, config_); };
    r.scheduler = [this](nn::Optimizer& optimizer) { return recipe_scheduler<Recipe>(optimizer, config_); };
    r.fsdp_options = [this] { return recipe_fsdp_options<Recipe>(config_); };
    return r;
  }

  Config config_;
  Dataset train_, test_;
  WorkerCore core_;
};

}  // namespace troupe::train
