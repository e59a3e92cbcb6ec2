// Recipe: what a TrainWorker is built from on every rank -- plain factories, since
// actors are built from serialised arguments:
//
//   struct Recipe {
//     struct Config { ...; template <class A> void serialize(A&); };  // sent to every rank
//     static std::unique_ptr<nn::Module> make_model(const Config&);
//     // Optional: the model built on `device`. With it, zero1/zero2/fsdp build the model
//     // on the meta device and each rank materialises only its part (troupe/parallel/sharded_model.hpp).
//     static std::unique_ptr<nn::Module> make_model(const Config&, tensor::Device);
//     // Optional: this rank's part of the model split over `tp` (WorkerOptions::tensor_parallel;
//     // troupe/parallel/tensor_parallel.hpp), whose logits are split by vocabulary.
//     static std::unique_ptr<nn::Module> make_model(const Config&, collectives::Communicator& tp);
//     // Optional: stage `stage` of the model cut into `stages` (WorkerOptions::pipeline_parallel;
//     // troupe/parallel/pipeline.hpp), and, with both parallelisms, that stage split over `tp`.
//     static std::unique_ptr<parallel::PipelineStage> make_stage(const Config&, int stage, int stages);
//     static std::unique_ptr<parallel::PipelineStage> make_stage(const Config&, int stage, int stages,
//                                                                collectives::Communicator& tp);
//     static std::unique_ptr<nn::Optimizer> make_optimizer(nn::Module&, const Config&);
//     // For zero1/zero2/fsdp: the same optimizer over any parameters (OSS's partition,
//     // FSDP's flat shards) -- an OptimizerFactory. Optional for ddp.
//     static std::unique_ptr<nn::Optimizer> make_optimizer(std::vector<nn::NamedParameter>, const Config&);
//     // Optional: FSDP's units (default: every parameterised leaf module).
//     static FsdpOptions fsdp_options(const Config&);
//     static TensorDataset train_set(const Config&);  // every rank loads the same set
//     static TensorDataset test_set(const Config&);
//     // Optional: what to minimise and report (default: CrossEntropyObjective).
//     static std::unique_ptr<Objective> make_objective(const Config&);
//     // Optional: the learning rate as a function of the step (lr_at), set before every
//     // step -- a pure function of the checkpointed step, so a resume is exact.
//     static std::unique_ptr<nn::LRScheduler> make_scheduler(nn::Optimizer&, const Config&);
//   };
// A data set is anything with size() and rows(indices) -> TensorBatch: TensorDataset
// (rows of tensors) or TokenWindows (a token stream's (B, T+1) windows). The objective
// turns the model's output and the batch's targets into the loss and metric sums, so a
// classifier, a language model and a regression train in the same worker.
//
// The recipe_* functions below call the optional factories, or give the defaults.
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/lr_scheduler.hpp"
#include "troupe/nn/optimizer.hpp"
#include "troupe/parallel/fsdp.hpp"
#include "troupe/parallel/oss.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/tensor/device.hpp"
#include "troupe/train/objective.hpp"

namespace troupe::train {

// The recipe's optimizer over any parameters, for OSS's partition or FSDP's shards;
// a recipe without one is an InvalidArgument naming `sharding`, the mode that needs it.
template <class Recipe>
parallel::OptimizerFactory recipe_optimizer_factory(const typename Recipe::Config& config,
                                                    const std::string& sharding) {
  using Config = typename Recipe::Config;
  if constexpr (requires(std::vector<nn::NamedParameter> params, const Config& c) {
                  {
                    Recipe::make_optimizer(std::move(params), c)
                    } -> std::convertible_to<std::unique_ptr<nn::Optimizer>>;
                }) {
    return
        [config](std::vector<nn::NamedParameter> params) { return Recipe::make_optimizer(std::move(params), config); };
  } else {
    TROUPE_THROW(InvalidArgument, "TrainWorker: sharding ", sharding,
                 " needs the recipe's make_optimizer(std::vector<nn::NamedParameter>, const Config&), "
                 "an optimizer over any parameters");
  }
}

template <class Recipe>
constexpr bool recipe_builds_on_device = requires(const typename Recipe::Config& c) {
  { Recipe::make_model(c, tensor::Device::meta()) } -> std::convertible_to<std::unique_ptr<nn::Module>>;
};

// The recipe's model: in a sharded mode, described on the meta device when the recipe
// can build it there (no rank then ever holds it whole, unless the mode keeps it
// whole); otherwise built on the CPU as make_model(config) builds it.
template <class Recipe>
std::unique_ptr<nn::Module> recipe_model(const typename Recipe::Config& config, bool sharded) {
  if constexpr (recipe_builds_on_device<Recipe>) {
    if (sharded) return Recipe::make_model(config, tensor::Device::meta());
  }
  return Recipe::make_model(config);
}

// The recipe's tensor-parallel model; a recipe without one is an InvalidArgument.
template <class Recipe>
std::unique_ptr<nn::Module> recipe_tensor_parallel_model(const typename Recipe::Config& config,
                                                         collectives::Communicator& tp) {
  if constexpr (requires {
                  { Recipe::make_model(config, tp) } -> std::convertible_to<std::unique_ptr<nn::Module>>;
                })
    return Recipe::make_model(config, tp);
  else
    TROUPE_THROW(InvalidArgument, "TrainWorker: tensor parallelism needs the recipe's ",
                 "make_model(const Config&, collectives::Communicator& tp), the model split over tp");
}

// The recipe's pipeline stage (split over `tp` when given); a recipe without one is an
// InvalidArgument.
template <class Recipe>
std::unique_ptr<parallel::PipelineStage> recipe_pipeline_stage(const typename Recipe::Config& config, int stage,
                                                               int stages, collectives::Communicator* tp) {
  if (tp != nullptr) {
    if constexpr (requires {
                    {
                      Recipe::make_stage(config, stage, stages, *tp)
                      } -> std::convertible_to<std::unique_ptr<parallel::PipelineStage>>;
                  })
      return Recipe::make_stage(config, stage, stages, *tp);
    else
      TROUPE_THROW(InvalidArgument, "TrainWorker: tensor and pipeline parallelism together need the recipe's ",
                   "make_stage(const Config&, int stage, int stages, collectives::Communicator& tp), a stage ",
                   "split over tp");
  }
  if constexpr (requires {
                  {
                    Recipe::make_stage(config, stage, stages)
                    } -> std::convertible_to<std::unique_ptr<parallel::PipelineStage>>;
                })
    return Recipe::make_stage(config, stage, stages);
  else
    TROUPE_THROW(InvalidArgument, "TrainWorker: pipeline parallelism needs the recipe's ",
                 "make_stage(const Config&, int stage, int stages), the model cut into stages");
}

template <class Recipe>
parallel::FsdpOptions recipe_fsdp_options(const typename Recipe::Config& config) {
  if constexpr (requires {
                  { Recipe::fsdp_options(config) } -> std::convertible_to<parallel::FsdpOptions>;
                })
    return Recipe::fsdp_options(config);
  else
    return {};
}

template <class Recipe>
std::unique_ptr<Objective> recipe_objective(const typename Recipe::Config& config) {
  if constexpr (requires {
                  { Recipe::make_objective(config) } -> std::convertible_to<std::unique_ptr<Objective>>;
                })
    return Recipe::make_objective(config);
  else
    return std::make_unique<CrossEntropyObjective>();
}

// nullptr: the optimizer's lr stays as built.
template <class Recipe>
std::unique_ptr<nn::LRScheduler> recipe_scheduler(nn::Optimizer& optimizer, const typename Recipe::Config& config) {
  if constexpr (requires {
                  {
                    Recipe::make_scheduler(optimizer, config)
                    } -> std::convertible_to<std::unique_ptr<nn::LRScheduler>>;
                })
    return Recipe::make_scheduler(optimizer, config);
  else
    return nullptr;
}

}  // namespace troupe::train
