#include "troupe/train/training_checkpoint.hpp"

#include <cereal/archives/binary.hpp>
#include <future>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "troupe/checkpoint/state_groups.hpp"
#include "troupe/error.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::train {

namespace {

// Rank 0's attributes on every rank: the small groups are whole everywhere, and the
// file holds rank 0's values, as the gathered save did (rank 0 wrote it).
void broadcast_from_rank_0(std::vector<checkpoint::AttributeSpec>& attributes, MPI_Comm comm) {
  int rank = 0;
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  std::string bytes;
  if (rank == 0) {
    std::ostringstream out;
    {
      cereal::BinaryOutputArchive archive(out);
      archive(attributes);
    }
    bytes = out.str();
  }
  long long size = static_cast<long long>(bytes.size());
  TROUPE_MPI_CHECK(MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, comm));
  bytes.resize(static_cast<std::size_t>(size));
  TROUPE_MPI_CHECK(MPI_Bcast(bytes.data(), static_cast<int>(size), MPI_BYTE, 0, comm));
  if (rank == 0) return;
  std::istringstream in(bytes);
  cereal::BinaryInputArchive archive(in);
  attributes.clear();
  archive(attributes);
}

}  // namespace

TrainingCheckpoint::TrainingCheckpoint(std::filesystem::path folder, TrainingState& state, checkpoint::RunInfo run,
                                       bool writer, std::size_t keep_last, MPI_Comm comm)
    : folder_(std::move(folder)), state_(state), writer_(writer), source_{&state, {}}, checkpoint_(folder_, keep_last),
      run_(run) {
  checkpoint_.set_run_info(std::move(run));
  // One section per group of the state (fixed by how it was built: a scaler or not).
  checkpoint::register_state_groups(checkpoint_, source_, state_.group_names());
  int mpi = 0;
  MPI_Initialized(&mpi);
  if (mpi && state_.has_local_state_slices()) {
    parallel_ = std::make_unique<checkpoint::ParallelCheckpoint>(folder_, keep_last, comm);
    TROUPE_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  }
}

TrainingCheckpoint::~TrainingCheckpoint() {
  parallel_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::optional<checkpoint::Metadata> TrainingCheckpoint::resume() { return checkpoint_.load_latest(); }

checkpoint::SaveHandle TrainingCheckpoint::save(std::int64_t step, std::int64_t epoch) {
  if (!writer_ && !state_.collective()) return {};
  if (step == last_step_) return last_;  // a periodic save and the epoch's end at the same step
  last_step_ = step;
  if (parallel_) return last_ = save_parallel(step, epoch);
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

// The manifest is what Checkpoint::save would write from state_dicts(): the sections
// in group order, each group's tensors in its dict's order, and -- outside /model --
// its 0-dim f64/i64 entries as attributes (register_state_groups' rule).
checkpoint::SaveHandle TrainingCheckpoint::save_parallel(std::int64_t step, std::int64_t epoch) {
  using checkpoint::detail::is_attribute_scalar;
  using checkpoint::detail::scalar_value;
  std::optional<LocalStateSlices> local = state_.local_state_slices();  // zero1/zero2: a collective (names only)
  TROUPE_CHECK(local.has_value(), "TrainingCheckpoint: the sharded state has no local slices");
  int rank = 0;
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm_, &rank));

  checkpoint::SaveManifest manifest;
  manifest.step = step;
  manifest.epoch = epoch;
  manifest.world_size = run_.world_size;
  manifest.run_id = run_.run_id;
  manifest.config_json = run_.config_json;
  for (const auto& [name, value] : run_.attributes) manifest.attributes.push_back({"/", name, value});
  for (const std::string& name : state_.group_names()) manifest.groups.push_back("/" + name);
  std::vector<checkpoint::Slice> slices;
  const auto pieces = [&](const std::string& group, std::vector<StateSlice>& from) {
    for (StateSlice& piece : from) {
      manifest.add_tensor(group + piece.name, piece.dtype, piece.shape);
      slices.push_back(checkpoint::Slice{piece.begin, std::move(piece.data)});
    }
  };
  // A small group's entry: an attribute, or a tensor that rank 0 writes whole.
  const auto whole = [&](const std::string& group, const nn::StateDict& dict, bool scalars_as_attributes) {
    for (const auto& [key, value] : dict) {
      if (scalars_as_attributes && is_attribute_scalar(key, value)) {
        manifest.attributes.push_back({group, key, scalar_value(value)});
        continue;
      }
      manifest.add_tensor(group + "/" + key, value.dtype(), value.shape());
      slices.push_back(rank == 0 ? checkpoint::Slice{0, value.device().is_cpu() ? value : value.to(tensor::Device::cpu())}
                                 : checkpoint::Slice{});
    }
  };
  pieces("/model/", local->model);
  whole("/optimizer", local->optimizer_scalars, true);
  pieces("/optimizer/", local->optimizer);
  for (const auto& [group, dict] : state_.small_state_dicts()) whole("/" + group, dict, true);
  broadcast_from_rank_0(manifest.attributes, comm_);

  parallel_->save(manifest, slices);  // collective; throws on every rank, keeping the previous checkpoint
  std::promise<std::filesystem::path> done;
  done.set_value(parallel_->directory().final_path(step));
  return checkpoint::SaveHandle(step, done.get_future().share());
}

void TrainingCheckpoint::wait() {
  if (!last_.skipped()) last_.get();
}

}  // namespace troupe::train
