#include "troupe/train/training_state.hpp"

#include <functional>

#include "troupe/error.hpp"
#include "troupe/nn/dropout.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/grad_scaler.hpp"
#include "troupe/parallel/master_weights.hpp"
#include "troupe/train/distributed_sampler.hpp"

namespace troupe::train {

namespace {

Tensor i64(std::int64_t v) {
  Tensor t = Tensor::empty({}, DType::i64);
  *t.data<std::int64_t>() = v;
  return t;
}
std::int64_t as_i64(const nn::StateDict& dict, const char* key) { return dict.at(key).to_vector<std::int64_t>().at(0); }

// Every Dropout in the tree, with its full module name ("3" or "block.drop").
void find_dropouts(nn::Module& module, const std::string& prefix,
                   std::vector<std::pair<std::string, nn::Dropout*>>& out) {
  if (auto* dropout = dynamic_cast<nn::Dropout*>(&module)) out.emplace_back(prefix.empty() ? "root" : prefix, dropout);
  for (const auto& child : module.named_children())
    find_dropouts(*child.module, prefix.empty() ? child.name : prefix + "." + child.name, out);
}

const nn::StateDict& group(const StateGroups& groups, const std::string& name) {
  for (const auto& [key, dict] : groups)
    if (key == name) return dict;
  std::string present;
  for (const auto& [key, dict] : groups) present += (present.empty() ? "" : ", ") + key;
  TROUPE_THROW(InvalidArgument, "TrainingState::load_state_dicts: group '", name,
               "' is missing (present: ", present.empty() ? "none" : present, ")");
}

}  // namespace

StateGroups clone(const StateGroups& groups) {
  StateGroups out;
  for (const auto& [name, dict] : groups) {
    nn::StateDict copy;
    for (const auto& [key, tensor] : dict) copy.insert(key, tensor.clone());
    out.emplace_back(name, std::move(copy));
  }
  return out;
}

TrainingState::TrainingState(nn::Module& model, nn::Optimizer& optimizer, DistributedSampler& sampler,
                             parallel::DistributedDataParallel* ddp, parallel::GradScaler* scaler,
                             parallel::MasterWeights* master)
    : model_(model), optimizer_(optimizer), sampler_(sampler), ddp_(ddp), scaler_(scaler), master_(master) {}

TrainingState::TrainingState(nn::Module& model, nn::Optimizer& optimizer, DistributedSampler& sampler,
                             parallel::ShardedStateDicts& sharded)
    : model_(model), optimizer_(optimizer), sampler_(sampler), ddp_(nullptr), scaler_(nullptr), sharded_(&sharded) {}

std::vector<std::string> TrainingState::group_names() const {
  std::vector<std::string> names{"model", "optimizer", "sampler"};
  if (scaler_ != nullptr) names.emplace_back("scaler");
  names.emplace_back("rng");
  names.emplace_back("status");
  return names;
}

StateGroups TrainingState::state_dicts() const {
  StateGroups groups;
  groups.emplace_back("model", sharded_ != nullptr  ? sharded_->model_state_dict()
                               : master_ != nullptr ? master_->state_dict(model_)
                                                    : model_.state_dict());
  groups.emplace_back("optimizer", sharded_ != nullptr ? sharded_->optimizer_state_dict() : optimizer_.state_dict());
  for (auto& group : small_state_dicts()) groups.push_back(std::move(group));
  return groups;
}

std::optional<parallel::LocalStateSlices> TrainingState::local_state_slices() const {
  if (sharded_ == nullptr || !sharded_->has_local_state_slices()) return std::nullopt;
  return sharded_->local_state_slices();
}

StateGroups TrainingState::small_state_dicts() const {
  StateGroups groups;
  groups.emplace_back("sampler", sampler_.state_dict());
  if (scaler_ != nullptr) groups.emplace_back("scaler", scaler_->state_dict());
  nn::StateDict rng;
  std::vector<std::pair<std::string, nn::Dropout*>> dropouts;
  find_dropouts(model_, "", dropouts);
  for (const auto& [name, dropout] : dropouts) {
    rng.insert(name + ".seed", i64(static_cast<std::int64_t>(dropout->generator().seed())));
    rng.insert(name + ".offset", i64(static_cast<std::int64_t>(dropout->generator().offset())));
  }
  groups.emplace_back("rng", sharded_ != nullptr ? sharded_->whole_random_state(std::move(rng)) : std::move(rng));
  nn::StateDict status;
  status.insert("step", i64(step));
  status.insert("epoch", i64(epoch));
  status.insert("micro_step", i64(sharded_ != nullptr ? sharded_->micro_step()
                                  : ddp_ != nullptr   ? ddp_->micro_step()
                                                      : 0));
  groups.emplace_back("status", std::move(status));
  return groups;
}

void TrainingState::load_state_dicts(const StateGroups& groups) {
  // Look everything up first, so a missing group changes nothing.
  const nn::StateDict& model = group(groups, "model");
  const nn::StateDict& optimizer = group(groups, "optimizer");
  check_small_groups(groups);
  if (sharded_ != nullptr) {
    sharded_->load_model_state_dict(model);
    sharded_->load_optimizer_state_dict(optimizer);
  } else {
    if (master_ != nullptr)
      master_->load_state_dict(model_, model, /*strict=*/true);
    else
      model_.load_state_dict(model, /*strict=*/true);
    optimizer_.load_state_dict(optimizer);
  }
  load_small_groups(groups);
}

void TrainingState::load_state_slices(const StateGroups& small, const parallel::StateSliceSource& model,
                                      const parallel::StateSliceSource& optimizer) {
  TROUPE_CHECK(loads_local_state_slices(), "TrainingState::load_state_slices: the state cannot load its own slices");
  check_small_groups(small);
  sharded_->load_local_state_slices(model, optimizer);
  load_small_groups(small);
}

void TrainingState::check_small_groups(const StateGroups& groups) const {
  (void)group(groups, "sampler");
  if (scaler_ != nullptr) (void)group(groups, "scaler");
  (void)group(groups, "rng");
  (void)group(groups, "status");
}

void TrainingState::load_small_groups(const StateGroups& groups) {
  const nn::StateDict& sampler = group(groups, "sampler");
  const nn::StateDict* scaler = scaler_ != nullptr ? &group(groups, "scaler") : nullptr;
  const nn::StateDict& rng = group(groups, "rng");
  const nn::StateDict& status = group(groups, "status");
  sampler_.load_state_dict(sampler);
  if (scaler != nullptr) scaler_->load_state_dict(*scaler);
  std::vector<std::pair<std::string, nn::Dropout*>> dropouts;
  find_dropouts(model_, "", dropouts);
  for (const auto& [name, dropout] : dropouts)
    dropout->generator().set_state(static_cast<std::uint64_t>(as_i64(rng, (name + ".seed").c_str())),
                                   static_cast<std::uint64_t>(as_i64(rng, (name + ".offset").c_str())));
  step = as_i64(status, "step");
  epoch = as_i64(status, "epoch");
  // A sampler that re-split the rest of the epoch (a state from another world size,
  // mid-epoch) starts it at position 0: the accumulation window count starts over too.
  const std::int64_t micro_step = sampler_.position() == 0 ? 0 : as_i64(status, "micro_step");
  if (ddp_ != nullptr) ddp_->set_micro_step(micro_step);
  if (sharded_ != nullptr) sharded_->set_micro_step(micro_step);
}

}  // namespace troupe::train
