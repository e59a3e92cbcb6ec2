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
// Sharded modes (TrainingState::collective(): zero1, zero2, fsdp): save() is a
// collective that every rank calls, and it is the parallel save -- nothing is gathered.
// Each rank hands its own pieces of the model and optimizer groups
// (TrainingState::local_state_slices: fsdp's flat shards, OSS's owned optimizer state,
// an even share of zero1/zero2's replicated model) to checkpoint::ParallelCheckpoint,
// which writes them all into one file through parallel HDF5; rank 0 adds the small
// groups (sampler, rng, status: attributes, its values broadcast so every rank agrees).
// The file is the one the gathered save wrote -- same groups in the same order, same
// tensor names, dtypes, attributes and checksums, DDP's layout -- so it resumes in any
// mode at any world size. No rank holds more than its pieces plus the writer's small
// buffers (fsdp: plus a copy of its optimizer shard, from Optimizer::state_dict).
// The sharded save is asynchronous, like PyTorch's async_save of a sharded state dict:
// save() copies this rank's pieces to host memory (the snapshot, the only stall) and a
// thread writes the file while training goes on (ParallelCheckpoint::save_async); the
// handle says when it is committed, a save waits for the one before it, and resume()
// and wait() wait for the one in flight. The write observer is called on every rank
// after each tensor, on that thread. Without MPI, or for a ShardedStateDicts without pieces, the
// groups are gathered onto every rank (state_dicts()) and the writer saves them
// asynchronously, as under DDP. resume() is collective. In a sharded mode it is the
// sharded resume: each rank verifies a share of the checksums (the ranks agree on
// every file's verdict, so all skip a damaged file together) and reads only its own
// slices of the model and optimizer groups (hyperslab reads), whatever the mode and
// world size that wrote the file (zero1: the whole model, straight into the module,
// and its own parameters' optimizer slots); unsharded states read the whole groups.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/parallel_checkpoint.hpp"
#include "troupe/train/training_state.hpp"

namespace troupe::train {

// One section of an open checkpoint file as a StateSliceSource: what the sharded resume
// reads the model and optimizer groups through (hyperslab reads, FileReader::read_range).
// The section's file must stay open while it is used.
class SectionSlices final : public parallel::StateSliceSource {
 public:
  explicit SectionSlices(const checkpoint::SectionReader& section) : section_(section) {}
  const std::vector<std::string>& names() const override;
  bool contains(const std::string& name) const override;
  tensor::DType dtype(const std::string& name) const override;
  tensor::Shape shape(const std::string& name) const override;
  void read(const std::string& name, std::int64_t begin, const tensor::Tensor& dst) const override;
  nn::StateDict scalars() const override;
  std::string where() const override;

 private:
  const checkpoint::SectionReader& section_;
};

class TrainingCheckpoint {
 public:
  // `comm` is the communicator of a sharded state's ranks (the worker group's world),
  // used for the parallel save; collective over it then (MPI_Comm_dup).
  TrainingCheckpoint(std::filesystem::path folder, TrainingState& state, checkpoint::RunInfo run, bool writer,
                     std::size_t keep_last = 3, MPI_Comm comm = MPI_COMM_WORLD);
  TrainingCheckpoint(const TrainingCheckpoint&) = delete;
  TrainingCheckpoint& operator=(const TrainingCheckpoint&) = delete;
  ~TrainingCheckpoint();  // collective when parallel() (frees the communicator's duplicates)

  // Restores the newest valid checkpoint into the state; nullopt when there is none.
  std::optional<checkpoint::Metadata> resume();
  // Starts writing a checkpoint of the state as it is now (on the writer only; other
  // ranks get a handle that is already complete). Every rank calls it, at the same steps.
  checkpoint::SaveHandle save(std::int64_t step, std::int64_t epoch);
  // Waits until the save in flight, if any, is durable.
  void wait();
  // Called on the calling rank with the step and the error of each save that failed
  // (ENOSPC, EIO, an fsync), when the next save starts or at wait(); for troupe-run's log.
  using SaveFailureHandler = std::function<void(std::int64_t step, const std::string& error)>;
  void set_save_failure_handler(SaveFailureHandler handler) { on_save_failure_ = std::move(handler); }
  // After this many failed saves in a row (default 2), save() throws CheckpointError
  // instead of training on with nothing durable: the run stops, naming the last
  // durable checkpoint, which a relaunch resumes from. 0 never stops.
  void set_max_failed_saves(int count) { max_failed_saves_ = count; }
  // Moves the folder's earlier checkpoints aside (Checkpoint::start_fresh) so that this
  // run starts over there; on the writer only, before resume().
  void start_fresh();
  // See Checkpoint::set_write_observer (before the first save).
  void set_write_observer(checkpoint::Checkpoint::WriteObserver observer) {
    if (parallel_) parallel_->set_write_observer(observer);
    checkpoint_.set_write_observer(std::move(observer));
  }
  // Whether save() is the parallel save (a sharded state with pieces, under MPI).
  bool parallel() const { return parallel_ != nullptr; }

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
  checkpoint::RunInfo run_;
  std::unique_ptr<checkpoint::ParallelCheckpoint> parallel_;  // sharded states: see above
  MPI_Comm comm_ = MPI_COMM_NULL;                             // its duplicate, for rank 0's attributes
  checkpoint::SaveHandle save_parallel(std::int64_t step, std::int64_t epoch);
  void register_sliced_groups();
  // The sharded resume's sections while a file is restored (see register_sliced_groups).
  std::optional<checkpoint::SectionReader> model_section_, optimizer_section_;
  StateGroups small_;
  checkpoint::SaveHandle last_;
  std::int64_t last_step_ = -1;  // on every rank: a repeated save of one step is skipped everywhere
  // Waits for the previous save and counts it: a failure is reported, and the run stops
  // after max_failed_saves_ in a row.
  void account_previous_save();
  SaveFailureHandler on_save_failure_;
  int max_failed_saves_ = 2;
  int failed_in_a_row_ = 0;
  std::int64_t accounted_step_ = -1;  // the last save whose outcome was counted
};

}  // namespace troupe::train
