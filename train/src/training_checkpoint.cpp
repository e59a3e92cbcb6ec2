#include "troupe/train/training_checkpoint.hpp"

#include <utility>

namespace troupe::train {

namespace {

const nn::StateDict& group_named(const StateGroups& groups, const std::string& name) {
  for (const auto& [group, dict] : groups) {
    if (group == name) return dict;
  }
  TROUPE_THROW(Error, "TrainingCheckpoint: the training state has no group '", name, "'");
}

}  // namespace

TrainingCheckpoint::TrainingCheckpoint(std::filesystem::path folder, TrainingState& state, checkpoint::RunInfo run,
                                       bool writer, std::size_t keep_last)
    : folder_(std::move(folder)), state_(state), writer_(writer), checkpoint_(folder_, keep_last) {
  checkpoint_.set_run_info(std::move(run));
  // The groups a state has are fixed by how it was built (a scaler or not, ...).
  for (const auto& [name, dict] : state_.state_dicts()) {
    checkpoint_.register_state(
        name, {.save =
                   [this, name](checkpoint::SectionWriter& out) {
                     checkpoint::write_state_dict(out, group_named(saving_, name), checkpoint::Scalars::as_attributes);
                   },
               .load =
                   [this, name](const checkpoint::SectionReader& in) {
                     loading_.emplace_back(name, checkpoint::read_state_dict<nn::StateDict>(
                                                     in, checkpoint::Scalars::as_attributes));
                   }});
  }
}

std::optional<checkpoint::Metadata> TrainingCheckpoint::resume() {
  loading_.clear();
  auto meta = checkpoint_.load_latest();
  if (meta) state_.load_state_dicts(loading_);
  loading_.clear();
  return meta;
}

checkpoint::SaveHandle TrainingCheckpoint::save(std::int64_t step, std::int64_t epoch) {
  if (!writer_) return {};
  if (step == last_.step()) return last_;  // a periodic save and the epoch's end at the same step
  // save_async copies every section to host memory before it returns, so the views
  // state_dicts() hands out are only read while the state cannot change.
  saving_ = state_.state_dicts();
  try {
    last_ = checkpoint_.save_async(step, epoch);
  } catch (...) {
    saving_.clear();
    throw;
  }
  saving_.clear();
  return last_;
}

void TrainingCheckpoint::wait() {
  if (!last_.skipped()) last_.get();
}

}  // namespace troupe::train
