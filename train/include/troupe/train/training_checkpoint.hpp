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
//
// Sharded modes (TrainingState::collective()): building the groups is a collective
// (full_state_dict, OSS's consolidation), so save() is called by every rank, every rank
// builds the groups once, and only the writer hands them to save_async; resume() is
// collective as before (every rank reads the file and loads its part).
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
  // ranks get a handle that is already complete). Every rank calls it, at the same steps.
  checkpoint::SaveHandle save(std::int64_t step, std::int64_t epoch);
  // Waits until the save in flight, if any, is durable.
  void wait();
  // See Checkpoint::set_write_observer (before the first save).
  void set_write_observer(checkpoint::Checkpoint::WriteObserver observer) {
    checkpoint_.set_write_observer(std::move(observer));
  }

  const std::filesystem::path& folder() const { return folder_; }

 private:
  // What the checkpoint's sections read and restore: the groups built once for the
  // save in progress (every section of one save sees the same snapshot, and a sharded
  // state's collectives run once, on every rank), and the state itself for a load.
  struct Source {
    TrainingState* state;
    StateGroups saving;  // set only while save_async snapshots the sections
    StateGroups state_dicts() const { return saving; }
    void load_state_dicts(const StateGroups& groups) { state->load_state_dicts(groups); }
  };

  std::filesystem::path folder_;
  TrainingState& state_;
  bool writer_;
  Source source_;
  checkpoint::Checkpoint checkpoint_;
  checkpoint::SaveHandle last_;
  std::int64_t last_step_ = -1;  // on every rank: a repeated save of one step is skipped everywhere
};

}  // namespace troupe::train
