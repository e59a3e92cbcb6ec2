// ParallelCheckpoint: the parallel save into a checkpoint folder. Every rank of the
// communicator calls save() with the same manifest (the full tensors, as for the
// gathered save) and its own slice of each tensor; ParallelWriter writes them all into
// one file at once, and the folder's crash safety is CheckpointDirectory's, unchanged:
//
//   1. every rank checks the manifest is the same everywhere (a digest per rank; when
//      they differ, every rank throws naming the first differing tensor or attribute);
//   2. rank 0 names the temporary file (.ckpt-<step>.h5.tmp-<rank 0's pid>) and the
//      creation time, and broadcasts both;
//   3. all ranks write it (ParallelWriter: root attributes, the manifest's groups,
//      datasets in manifest order, section attributes, "complete"), sync their own writes and close it together;
//   4. once every rank has closed it, rank 0 commits: fsync, rename, fsync the folder,
//      `latest`, keep_last; every rank learns the outcome.
// An error anywhere is thrown on every rank, the temporary file is removed, and the
// checkpoints already in the folder are untouched.
//
//   checkpoint::ParallelCheckpoint ckpt("runs/ckpt", /*keep_last=*/3, MPI_COMM_WORLD);
//   SaveManifest m{.step = step, .epoch = epoch, .world_size = world};
//   m.add_tensor("/model/fc1.weight", DType::f32, {4096, 1024});
//   auto [r0, r1] = shard_range(4096, rank, world);                 // my rows
//   std::vector<Slice> mine{Slice::rows(r0, fc1_weight_rows)};
//   ckpt.save(m, mine);                                              // collective
//
// Loading needs nothing special: the file is an ordinary checkpoint (Checkpoint,
// FileReader; read_range re-slices it for any world size).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "troupe/checkpoint/checkpoint_directory.hpp"
#include "troupe/checkpoint/parallel_writer.hpp"
#include "troupe/checkpoint/save_handle.hpp"
#include "troupe/checkpoint/save_manifest.hpp"
#include "troupe/tensor/storage.hpp"

namespace troupe::checkpoint {

class ParallelCheckpoint {
 public:
  // Collective. Every rank names the same folder, on a file system every rank sees; the
  // communicator is duplicated.
  ParallelCheckpoint(std::filesystem::path folder, std::size_t keep_last, MPI_Comm comm, ParallelOptions options = {});
  ParallelCheckpoint(const ParallelCheckpoint&) = delete;
  ParallelCheckpoint& operator=(const ParallelCheckpoint&) = delete;
  ~ParallelCheckpoint();  // collective (waits for the save in flight, frees the communicator's duplicate)

  // Collective. `slices[i]` is this rank's slice of manifest.tensors[i] (Slice{} for
  // none). Returns the committed file's path on every rank, or throws on every rank.
  std::filesystem::path save(const SaveManifest& manifest, std::span<const Slice> slices);
  // Collective, the save in the background: waits for the save in flight (one at a
  // time), copies this rank's slices to host memory (the snapshot: the only time the
  // caller is blocked, so training may change its shards once it returns), then a
  // thread of this object runs save() -- the same file, the same crash safety, errors
  // thrown on every rank through the handle. Every rank calls it at the same steps.
  // Memory: the snapshot, one host buffer of this rank's slices, kept for the next
  // save (first-touch page faults would otherwise make the copy slower than the write).
  SaveHandle save_async(SaveManifest manifest, std::vector<Slice> slices);
  // Waits for the save in flight, if any (its error stays with its handle).
  void wait();

  const CheckpointDirectory& directory() const { return dir_; }

  // Called on every rank after each tensor's collective write, before the commit, like
  // Checkpoint::set_write_observer (TROUPE_FAULT kind=crash_in_save kills a rank here).
  using WriteObserver = std::function<void(std::int64_t step, std::string_view tensor)>;
  void set_write_observer(WriteObserver observer) { observe_ = std::move(observer); }

 private:
  CheckpointDirectory dir_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // used by one thread at a time: the caller's, or the writer's
  ParallelOptions options_;
  WriteObserver observe_;
  std::shared_future<std::filesystem::path> in_flight_;
  std::thread writer_;
  std::shared_ptr<tensor::Storage> snapshot_;  // save_async's host buffer
  bool snapshot_pinned_ = false;               // page-locked (cudaHostAlloc)
};

}  // namespace troupe::checkpoint
