#include "troupe/train/training_checkpoint.hpp"

#include <utility>

#include "troupe/checkpoint/state_groups.hpp"

namespace troupe::train {

TrainingCheckpoint::TrainingCheckpoint(std::filesystem::path folder, TrainingState& state, checkpoint::RunInfo run,
                                       bool writer, std::size_t keep_last)
    : folder_(std::move(folder)), state_(state), writer_(writer), source_{&state, {}}, checkpoint_(folder_, keep_last) {
  checkpoint_.set_run_info(std::move(run));
  // One section per group of the state (fixed by how it was built: a scaler or not).
  checkpoint::register_state_groups(checkpoint_, source_, state_.group_names());
}

std::optional<checkpoint::Metadata> TrainingCheckpoint::resume() { return checkpoint_.load_latest(); }

checkpoint::SaveHandle TrainingCheckpoint::save(std::int64_t step, std::int64_t epoch) {
  if (!writer_ && !state_.collective()) return {};
  if (step == last_step_) return last_;  // a periodic save and the epoch's end at the same step
  last_step_ = step;
  StateGroups groups = state_.state_dicts();  // a collective when the state is sharded
  if (!writer_) return {};
  // save_async copies every section to host memory before it returns, so the state is
  // only read while this (the training) thread cannot change it.
  source_.saving = std::move(groups);
  try {
    last_ = checkpoint_.save_async(step, epoch);
  } catch (...) {
    source_.saving.clear();
    throw;
  }
  source_.saving.clear();
  return last_;
}

void TrainingCheckpoint::wait() {
  if (!last_.skipped()) last_.get();
}

}  // namespace troupe::train
