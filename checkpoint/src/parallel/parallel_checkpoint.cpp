#include "troupe/checkpoint/parallel_checkpoint.hpp"

#include <unistd.h>

#include <string>
#include <vector>

#include "rank_agreement.hpp"
#include "troupe/checkpoint/checkpoint.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/mpi/mpi_error.hpp"
#include "troupe/tensor/cuda_memory.hpp"

namespace troupe::checkpoint {

namespace fs = std::filesystem;

namespace {

// The manifest as lines, so ranks that disagree are told the first line that differs.
std::vector<std::string> describe(const SaveManifest& m) {
  std::vector<std::string> lines{"step " + std::to_string(m.step) + ", epoch " + std::to_string(m.epoch) +
                                     ", world_size " + std::to_string(m.world_size),
                                 "run_id " + m.run_id, "config " + m.config_json,
                                 std::to_string(m.tensors.size()) + " tensors, " + std::to_string(m.attributes.size()) +
                                     " attributes, " + std::to_string(m.groups.size()) + " groups"};
  for (const TensorSpec& t : m.tensors) {
    std::string line = "tensor " + t.path + " " + t.dtype + " [";
    for (std::size_t i = 0; i < t.shape.size(); ++i) line += (i ? ", " : "") + std::to_string(t.shape[i]);
    lines.push_back(line + "]");
  }
  for (const AttributeSpec& a : m.attributes)
    lines.push_back("attribute " + a.group + " " + a.name + " = " + to_string(a.value));
  for (const std::string& g : m.groups) lines.push_back("group " + g);
  return lines;
}

}  // namespace

ParallelCheckpoint::ParallelCheckpoint(fs::path folder, std::size_t keep_last, MPI_Comm comm, ParallelOptions options)
    : dir_(std::move(folder), keep_last), options_(options) {
  TROUPE_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
}

ParallelCheckpoint::~ParallelCheckpoint() {
  wait();
  int finalized = 0;
  MPI_Finalized(&finalized);  // a program that finalised MPI first: nothing left to free
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void ParallelCheckpoint::wait() {
  if (in_flight_.valid()) in_flight_.wait();
  if (writer_.joinable()) writer_.join();
  in_flight_ = {};
}

SaveHandle ParallelCheckpoint::save_async(SaveManifest manifest, std::vector<Slice> slices) {
  wait();
  // The snapshot: every slice copied into one host buffer, kept for the next save --
  // fresh memory costs a page fault per page on first touch, which made a 400 MB
  // snapshot take longer than the write it was meant to hide.
  // Slices on a GPU are copied into page-locked memory, by DMA.
  constexpr std::size_t kAlign = 64;  // a multiple of every element size
  std::size_t total = 0;
  bool from_device = false;
  for (const Slice& slice : slices)
    if (slice.data.defined()) {
      total += (slice.data.nbytes() + kAlign - 1) / kAlign * kAlign;
      from_device = from_device || !slice.data.device().is_cpu();
    }
  if (!snapshot_ || snapshot_->nbytes() < total || (from_device && !snapshot_pinned_)) {
    snapshot_.reset();  // the old buffer goes before the new one is allocated
    if (from_device && total > 0) {
      snapshot_ = tensor::pinned_empty({static_cast<std::int64_t>(total)}, tensor::DType::u8).storage();
      snapshot_pinned_ = true;
    } else {
      snapshot_ = tensor::Storage::allocate(total, tensor::Device::cpu());
      snapshot_pinned_ = false;
    }
  }
  std::size_t at = 0;
  for (Slice& slice : slices) {
    if (!slice.data.defined()) continue;
    tensor::Tensor copy = tensor::Tensor::from_storage(snapshot_, slice.data.shape(), slice.data.dtype(),
                                                       static_cast<std::int64_t>(at / slice.data.element_bytes()));
    copy.copy_(slice.data);
    slice.data = std::move(copy);
    at += (slice.data.nbytes() + kAlign - 1) / kAlign * kAlign;
  }
  const std::int64_t step = manifest.step;
  auto task = std::make_shared<std::packaged_task<fs::path()>>(
      [this, manifest = std::move(manifest), slices = std::move(slices)] { return save(manifest, slices); });
  in_flight_ = task->get_future().share();
  writer_ = std::thread([task] { (*task)(); });
  return SaveHandle(step, in_flight_);
}

fs::path ParallelCheckpoint::save(const SaveManifest& manifest, std::span<const Slice> slices) {
  detail::RankAgreement agreement(comm_);
  agreement.set_context("checkpoint " + dir_.folder().string() + " step " + std::to_string(manifest.step) +
                        " (parallel save, rank " + std::to_string(agreement.rank()) + " of " +
                        std::to_string(agreement.size()) + ")");
  // 1. The same manifest everywhere, and a slice (or Slice{}) for each of its tensors.
  std::string problem;
  try {
    dir_.final_path(manifest.step);  // checks the step fits the file name
    if (agreement.rank() == 0) dir_.check_free_space();
    TROUPE_CHECK(slices.size() == manifest.tensors.size(), "save: ", slices.size(), " slices for ",
                 manifest.tensors.size(), " tensors (pass Slice{} for a tensor this rank holds none of)");
  } catch (const Error& e) {
    problem = e.what();
  }
  agreement.agree(describe(manifest), problem);

  // 2. Rank 0's temporary name (its pid marks it as in flight) and clock, for everyone.
  std::string temp = agreement.broadcast(agreement.rank() == 0 ? dir_.temp_path(manifest.step).string() : "", 0);
  std::string created = agreement.broadcast(agreement.rank() == 0 ? utc_now_iso8601() : "", 0);

  // 3. Everyone writes. ParallelWriter throws on every rank at once, so all ranks are in
  //    this handler together, their writers closed; rank 0 removes the unfinished file.
  try {
    ParallelWriter file(temp, comm_, options_);
    file.set_attribute("/", "step", manifest.step);
    file.set_attribute("/", "epoch", manifest.epoch);
    file.set_attribute("/", "world_size", manifest.world_size);
    file.set_attribute("/", "created_utc", created);
    file.set_attribute("/", "run_id", manifest.run_id);
    file.set_attribute("/", "config", manifest.config_json);
    for (const std::string& group : manifest.groups) file.ensure_group(group);
    file.write_all(manifest.tensors, slices, [&](std::size_t i) {
      if (observe_) observe_(manifest.step, manifest.tensors[i].path);
    });
    for (const AttributeSpec& a : manifest.attributes) file.set_attribute(a.group, a.name, a.value);
    file.close();
  } catch (...) {
    if (agreement.rank() == 0) {
      std::error_code ec;
      fs::remove(temp, ec);
    }
    throw;
  }

  // 4. Every rank has synced and closed the file (close() ends with an allreduce):
  //    rank 0 makes it the checkpoint, and every rank learns whether that worked.
  agreement.all_or_none([&] {
    if (agreement.rank() != 0) return;
    try {
      dir_.commit(temp, manifest.step);
    } catch (...) {
      std::error_code ec;
      fs::remove(temp, ec);
      throw;
    }
  });
  return dir_.final_path(manifest.step);
}

}  // namespace troupe::checkpoint
