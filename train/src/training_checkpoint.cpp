#include "troupe/train/training_checkpoint.hpp"

#include <cereal/archives/binary.hpp>
#include <future>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "troupe/checkpoint/error.hpp"
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

// The first non-empty verdict of any rank (the lowest rank's), on every rank.
std::string first_verdict(const std::string& verdict, MPI_Comm comm) {
  int rank = 0;
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int mine = verdict.empty() ? std::numeric_limits<int>::max() : rank, first = 0;
  TROUPE_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == std::numeric_limits<int>::max()) return {};
  long long size = rank == first ? static_cast<long long>(verdict.size()) : 0;
  TROUPE_MPI_CHECK(MPI_Bcast(&size, 1, MPI_LONG_LONG, first, comm));
  std::string text = rank == first ? verdict : std::string(static_cast<std::size_t>(size), '\0');
  TROUPE_MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, first, comm));
  return text + " (found by rank " + std::to_string(first) + ")";
}

}  // namespace

const std::vector<std::string>& SectionSlices::names() const { return section_.tensor_names(); }
bool SectionSlices::contains(const std::string& name) const { return section_.has_tensor(name); }
tensor::DType SectionSlices::dtype(const std::string& name) const { return section_.info(name).dtype; }
tensor::Shape SectionSlices::shape(const std::string& name) const { return section_.info(name).shape; }

void SectionSlices::read(const std::string& name, std::int64_t begin, const tensor::Tensor& dst) const {
  if (dst.device().is_cpu() && dst.dtype() == section_.info(name).dtype)
    section_.read_range_into(name, begin, dst);
  else
    tensor::Tensor(dst).copy_(section_.read_range(name, begin, begin + dst.numel()));  // a handle: same storage
}

nn::StateDict SectionSlices::scalars() const {
  nn::StateDict out;
  for (const auto& [name, value] : section_.attributes())
    if (tensor::Tensor t = checkpoint::detail::scalar_tensor(value); t.defined()) out.insert(name, t);
  return out;
}

std::string SectionSlices::where() const { return section_.file_path() + ":" + section_.group(); }

TrainingCheckpoint::TrainingCheckpoint(std::filesystem::path folder, TrainingState& state, checkpoint::RunInfo run,
                                       bool writer, std::size_t keep_last, MPI_Comm comm)
    : folder_(std::move(folder)),
      state_(state),
      writer_(writer),
      source_{&state, {}},
      checkpoint_(folder_, keep_last),
      run_(run) {
  checkpoint_.set_run_info(std::move(run));
  checkpoint_.set_quarantine(writer_);  // one process renames a damaged file; the others skip it
  int mpi = 0;
  MPI_Initialized(&mpi);
  if (mpi && state_.has_local_state_slices()) {
    parallel_ = std::make_unique<checkpoint::ParallelCheckpoint>(folder_, keep_last, comm);
    TROUPE_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  }
  if (parallel_ && state_.loads_local_state_slices()) {
    register_sliced_groups();
    return;
  }
  // One section per group of the state (fixed by how it was built: a scaler or not).
  checkpoint::register_state_groups(checkpoint_, source_, state_.group_names());
}

// The sharded resume: each rank verifies its share of the checksums (the ranks agree
// on every verdict, so all skip or use the same file), reads the small groups whole
// and only its own slices of the model and optimizer groups. Saves are the parallel
// save, so these sections' save functions never run.
void TrainingCheckpoint::register_sliced_groups() {
  int rank = 0, size = 1;
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  TROUPE_MPI_CHECK(MPI_Comm_size(comm_, &size));
  checkpoint_.set_verify_share(
      {rank, size, [comm = comm_](const std::string& verdict) { return first_verdict(verdict, comm); }});
  const std::vector<std::string> names = state_.group_names();
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string name = names[i];
    const bool last = i + 1 == names.size();
    checkpoint_.register_state(
        name, {.save =
                   [name](checkpoint::SectionWriter&) {
                     TROUPE_THROW(InvalidArgument, "TrainingCheckpoint: section ", name,
                                  " of a sharded state is written by ", "the parallel save only");
                   },
               .load =
                   [this, name, first = i == 0, last](const checkpoint::SectionReader& r) {
                     if (first) {  // nothing left over from a file whose restore failed part way
                       small_.clear();
                       model_section_.reset();
                       optimizer_section_.reset();
                     }
                     if (name == "model" || name == "optimizer")
                       (name == "model" ? model_section_ : optimizer_section_).emplace(r);
                     else
                       small_.emplace_back(
                           name, checkpoint::read_state_dict<nn::StateDict>(r, checkpoint::scalars_for_group(name)));
                     if (!last) return;
                     StateGroups small = std::move(small_);
                     small_.clear();
                     TROUPE_CHECK(model_section_ && optimizer_section_,
                                  "TrainingCheckpoint: the file lacks a model or optimizer section");
                     const SectionSlices model(*model_section_), optimizer(*optimizer_section_);
                     try {
                       state_.load_state_slices(small, model, optimizer);
                     } catch (...) {
                       model_section_.reset();
                       optimizer_section_.reset();
                       throw;
                     }
                     model_section_.reset();
                     optimizer_section_.reset();
                   }});
  }
}

TrainingCheckpoint::~TrainingCheckpoint() {
  parallel_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::optional<checkpoint::Metadata> TrainingCheckpoint::resume() {
  if (parallel_) parallel_->wait();  // the save in flight may be the latest
  return checkpoint_.load_latest();
}

checkpoint::SaveHandle TrainingCheckpoint::save(std::int64_t step, std::int64_t epoch) {
  if (!writer_ && !state_.collective()) return {};
  if (step == last_step_) return last_;  // a periodic save and the epoch's end at the same step
  account_previous_save();
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
// in group order, each group's tensors in its dict's order, its scalars laid out by
// register_state_groups' rule (add_state_group).
checkpoint::SaveHandle TrainingCheckpoint::save_parallel(std::int64_t step, std::int64_t epoch) {
  std::optional<parallel::LocalStateSlices> local =
      state_.local_state_slices();  // zero1/zero2: a collective (names only)
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
  const auto pieces = [&](const std::string& group, std::vector<parallel::StateSlice>& from) {
    for (parallel::StateSlice& piece : from) {
      manifest.add_tensor(group + piece.name, piece.dtype, piece.shape);
      slices.push_back(checkpoint::Slice{piece.begin, std::move(piece.data)});
    }
  };
  // A small group: its scalars become attributes, its tensors rank 0 writes whole.
  const auto whole = [&](const std::string& group, const nn::StateDict& dict) {
    checkpoint::add_state_group(manifest, group, dict, [&](const tensor::Tensor& value) {
      slices.push_back(rank == 0
                           ? checkpoint::Slice{0, value.device().is_cpu() ? value : value.to(tensor::Device::cpu())}
                           : checkpoint::Slice{});
    });
  };
  pieces("/model/", local->model);
  whole("optimizer", local->optimizer_scalars);
  pieces("/optimizer/", local->optimizer);
  for (const auto& [group, dict] : state_.small_state_dicts()) whole(group, dict);
  broadcast_from_rank_0(manifest.attributes, comm_);

  // Collective: snapshots the pieces and writes the file on the checkpoint's thread; an
  // error reaches every rank through the handle, and the previous checkpoint stays.
  return parallel_->save_async(std::move(manifest), std::move(slices));
}

void TrainingCheckpoint::wait() {
  if (!last_.skipped()) {
    try {
      last_.get();
    } catch (const std::exception& e) {
      if (on_save_failure_ && accounted_step_ != last_.step()) on_save_failure_(last_.step(), e.what());
      accounted_step_ = last_.step();
      throw;
    }
  }
  if (parallel_) parallel_->wait();
}

void TrainingCheckpoint::account_previous_save() {
  if (last_.skipped() || last_.step() == accounted_step_) return;
  accounted_step_ = last_.step();
  std::string error;
  try {
    last_.get();  // the next save would wait for it anyway
    failed_in_a_row_ = 0;
    return;
  } catch (const std::exception& e) {
    error = e.what();
  }
  ++failed_in_a_row_;
  if (on_save_failure_) on_save_failure_(last_.step(), error);
  if (max_failed_saves_ <= 0 || failed_in_a_row_ < max_failed_saves_) return;
  const auto latest = checkpoint_.directory().latest_pointer();
  TROUPE_THROW(
      checkpoint::CheckpointError, "checkpoint: ", failed_in_a_row_, " saves in a row failed in ", folder_.string(),
      ", the last (step ", last_.step(), "): ", error, ". Stopping rather than training on with nothing durable; ",
      latest ? "the last durable checkpoint is " + latest->filename().string() + ", which a relaunch resumes from"
             : std::string("no checkpoint is durable yet"));
}

void TrainingCheckpoint::start_fresh() {
  if (writer_) checkpoint_.start_fresh();
}

}  // namespace troupe::train
