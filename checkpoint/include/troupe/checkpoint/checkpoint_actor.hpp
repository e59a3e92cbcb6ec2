// CheckpointActor: the gathered save. Every rank sends the pieces of the state it holds
// (a ZeRO/FSDP shard, or a whole tensor) to one actor, which writes each piece straight
// to its place in one full-state-dict file -- no rank ever holds the whole model.
//
// Protocol for one save (every rank, same manifest, same step):
//   1. actor.ask(&CheckpointActor::begin, manifest)      the first begin creates the
//      temporary file and every dataset (full shapes); later ones must match it.
//   2. send_piece(actor, step, index, elem_offset, t, rank)  for each piece this rank
//      holds: elements [elem_offset, elem_offset + t.numel()) of tensor `index` in
//      manifest order, flat C order. The bytes travel as a troupe::Bytes attachment
//      viewing t's storage (no copy): do not change t until the returned future is ready.
//   3. after every rank's pieces are acknowledged (their futures ready, then a barrier),
//      one rank asks commit(step): completeness is checked, checksums computed, the
//      file made durable and renamed (CheckpointDirectory), its path returned.
// Completeness is coverage, not a byte count: the actor keeps each tensor's written
// byte ranges, refuses a piece that starts before 0, runs past the tensor's end, is not
// whole elements, or overlaps bytes already written (each error naming the file,
// tensor, sending rank and ranges), and commit() requires every byte of every tensor
// written exactly once. A refused piece fails the whole save: commit() then throws with
// the first refusal and removes the temporary file; the last checkpoint stays latest.
// Memory on the actor's rank: one piece at a time plus a fixed 4 MB read-back buffer
// for the checksums -- pieces are pwritten at their offsets as they arrive, in any order.
// The file is the same format as Checkpoint::save writes (docs/CHECKPOINT_FORMAT.md).
// SaveManifest and shard_range live in save_manifest.hpp (the parallel save uses them too).
//
// A begin for another step while a save is open abandons the open one (its temporary
// file is removed); so does discard(step).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/actor_ref.hpp"
#include "troupe/actors/bytes.hpp"
#include "troupe/actors/methods.hpp"
#include "troupe/checkpoint/attribute.hpp"
#include "troupe/checkpoint/checkpoint_directory.hpp"
#include "troupe/checkpoint/file_writer.hpp"
#include "troupe/checkpoint/save_manifest.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::checkpoint {

class CheckpointActor {
 public:
  CheckpointActor(std::string folder, std::int64_t keep_last);
  ~CheckpointActor();

  void begin(SaveManifest manifest);
  void piece(std::int64_t step, std::int64_t index, std::int64_t byte_offset, std::int64_t from_rank,
             actors::Bytes data);
  std::string commit(std::int64_t step);
  // Abandons the open save of `step` (its temporary file is removed); the last
  // committed checkpoint stays latest.
  void discard(std::int64_t step);
  // Returns once the checkpoints the last commit let go are deleted (that runs on after
  // commit returns: CheckpointDirectory::wait_for_removals).
  void wait_for_removals();

  static constexpr auto troupe_methods =
      troupe::methods<&CheckpointActor::begin, &CheckpointActor::piece, &CheckpointActor::commit,
                      &CheckpointActor::discard, &CheckpointActor::wait_for_removals>;

 private:
  struct Open {
    SaveManifest manifest;
    std::filesystem::path temp;
    std::unique_ptr<FileWriter> file;
    std::vector<std::map<std::int64_t, std::int64_t>> written;  // per tensor: disjoint byte ranges, begin -> end
    std::string refused;                                        // the first refused piece, if any
  };
  Open& open_for(std::int64_t step, const char* what);
  void drop_open();

  CheckpointDirectory dir_;
  std::optional<Open> open_;
};

// Step 2 of the protocol above, for one piece held by rank `from_rank` (named in errors).
actors::Future<void> send_piece(const actors::ActorRef<CheckpointActor>& actor, std::int64_t step, std::int64_t index,
                                std::int64_t elem_offset, const tensor::Tensor& piece, std::int64_t from_rank);

}  // namespace troupe::checkpoint
