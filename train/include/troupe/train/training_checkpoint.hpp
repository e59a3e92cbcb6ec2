// TrainingCheckpoint: a TrainingState saved to and resumed from a checkpoint folder.
//
//   TrainingCheckpoint ckpt(dir, state, {.run_id = id, .world_size = n}, /*writer=*/rank == 0);
//   if (auto meta = ckpt.resume()) start_epoch = meta->epoch;   // every rank
//   ...
//   ckpt.save(state.step, state.epoch);                          // every rank; only the writer writes
//
// Each group of TrainingState::state_dicts() (model, optimizer, sampler, scaler, rng,
// status) becomes a section of the file under its own name (checkpoint's
// register_state_groups: scalars as group attributes outside /model). Under DDP
// every rank holds the same state, so one rank writes and every rank reads the same
// file: resume() picks the newest valid checkpoint (skipping torn or corrupt ones
// with a warning) and restores every group at once, so a bad file never leaves the
// state half restored.
//
// save() snapshots the state on the caller's thread and writes the file on the
// checkpoint's own thread while training goes on (Checkpoint::save_async); a save
// that starts while the previous one is still writing waits for it. The returned
// handle says when the file is durable.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <utility>

#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/train/training_state.hpp"

namespace troupe::train {

class TrainingCheckpoint {
 public:
  TrainingCheckpoint(std::filesystem::path folder, TrainingState& state, checkpoint::RunInfo run, bool writer,
                     std::size_t keep_last = 3);

  // Restores the newest valid checkpoint into the state; nullopt when there is none.
  std::optional<checkpoint::Metadata> resume();
  // Starts writing a checkpoint of the state as it is now (on the writer only; other
  // ranks get a handle that is already complete).
  checkpoint::SaveHandle save(std::int64_t step, std::int64_t epoch);
  // Waits until the save in flight, if any, is durable.
  void wait();
  // See Checkpoint::set_write_observer (before the first save).
  void set_write_observer(checkpoint::Checkpoint::WriteObserver observer) {
    checkpoint_.set_write_observer(std::move(observer));
  }

  const std::filesystem::path& folder() const { return folder_; }

 private:
  std::filesystem::path folder_;
  TrainingState& state_;
  bool writer_;
  checkpoint::Checkpoint checkpoint_;
  checkpoint::SaveHandle last_;
};

}  // namespace troupe::train
