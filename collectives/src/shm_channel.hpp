// ShmChannel: a shared-memory window between the ranks of one node, through which
// allreduce, reduce_scatter, allgather and broadcast move data without MPI.
//
// Why: Open MPI's shared-memory transport copies every message twice (into a FIFO,
// out of it) and its allreduce streams whole buffers through memory several times;
// past 8 MB it moves 1.4-2.4 GB/s on the 2-core VMs we measure on. Here each rank
// copies its data once into a slot of its own segment, and every peer reads it
// straight from there while it is still in cache (the L3 the cores share): per rank
// the buffer crosses main memory about twice (in and out), as a memcpy does.
//
// Layout: each rank maps a POSIX shared-memory segment of its own, and every peer's:
//   [ three counters, each on its own cache line ][ the signature board: a `checked`
//     counter and kBoardEntries entries ][ `slots` slots of `slot_bytes` ]
// The board is where each rank publishes every collective's signature, whatever path
// the collective takes, for its peers to compare (signature_check.hpp); a small
// blocking call's data travels in the same entry (board_route.hpp).
// The counters are monotonic round numbers, written only by the segment's owner and
// read by everyone: how many rounds it has `posted` (its data is in the slot), has
// `reduced` (its share of the result is in the slot) and has `consumed` (it read what
// it needed from everyone's slots, so they may be reused). A round uses slot
// round % slots on every rank; a rank may post round t only when every rank has
// consumed round t - slots.
//
// Rounds are numbered per channel across operations: collectives start in the same
// order on every rank (their sequence order), and each reserves its rounds at start,
// so round t means the same piece of the same collective everywhere.
//
// The ranks agree on whether the channel exists (all on one node, every segment
// created and mapped on every rank); otherwise create() returns null on all.
//
// Why POSIX shm_open rather than MPI_Win_allocate_shared: freeing an MPI window is
// collective and synchronising, so a communicator destroyed on one rank while a peer
// is elsewhere (an exception, a late save) would hang in its destructor. The segments
// here are unlinked as soon as every rank has mapped them: nothing is left in
// /dev/shm after a crash, and a destructor only unmaps (NCCL's SHM transport works the
// same way).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "slot_writer.hpp"
#include "troupe/collectives/collective.hpp"

namespace troupe::collectives::detail {

class ShmChannel {
 public:
  // Collective over `comm`. Null (on every rank) if the ranks are not all on one node
  // or a segment cannot be created or mapped.
  static std::unique_ptr<ShmChannel> create(MPI_Comm comm, std::size_t slot_bytes, int slots);
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;
  // Unmaps the segments; local, peers need not be there. A collective abandoned after
  // a failure must not outlive it (the communicator leaks the channel then).
  ~ShmChannel();

  enum Stage : int { posted = 0, reduced = 1, consumed = 2 };

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t slot_bytes() const { return slot_bytes_; }
  int slots() const { return slots_; }

  // Slot of `rank` for `round`.
  std::byte* slot(int rank, std::uint64_t round) const {
    return bases_[static_cast<std::size_t>(rank)] + kHeaderBytes +
           (round % static_cast<std::uint64_t>(slots_)) * slot_bytes_;
  }
  // How many rounds `rank` has completed of `stage`.
  std::uint64_t load(int rank, Stage stage) const { return counter(rank, stage).load(std::memory_order_acquire); }
  // Every rank has completed at least `rounds` rounds of `stage`; else the first rank
  // that has not (in *laggard).
  bool all_reached(Stage stage, std::uint64_t rounds, int* laggard) const;
  // This rank completed `rounds` rounds of `stage`.
  void publish(Stage stage, std::uint64_t rounds) { counter(rank_, stage).store(rounds, std::memory_order_release); }

  // The first of `rounds` consecutive rounds, for a collective starting now.
  std::uint64_t reserve(std::uint64_t rounds) {
    const std::uint64_t first = reserved_;
    reserved_ += rounds;
    return first;
  }

  // This rank's own progress through the rounds (not shared): the next round to post,
  // to reduce and to gather.
  std::uint64_t next[3] = {0, 0, 0};
  // How this rank copies into its slots (plain or streaming stores).
  SlotWriter writer;

  // ---- the signature board ----
  // Entry sequence % kBoardEntries of a rank: its call `sequence`'s signature, valid
  // while `sequence_plus_one` reads sequence + 1 (0: never written), followed by up to
  // kBoardPayloadBytes of the call's data when it is a small call that the board
  // carries whole (board_route.hpp): 8 bytes of it share the signature's cache line.
  // The owner writes the data and the fields, then publishes sequence_plus_one (release).
  static constexpr std::uint64_t kBoardEntries = 256;
  static constexpr int kSignatureFields = 6;
  static constexpr std::size_t kBoardPayloadBytes = 4096 + 8;
  struct BoardEntry {
    std::uint64_t sequence_plus_one;
    std::int64_t fields[kSignatureFields];
  };
  BoardEntry& board_entry(int rank, std::uint64_t sequence) const {
    return *reinterpret_cast<BoardEntry*>(bases_[static_cast<std::size_t>(rank)] + kBoardOffset + kLine +
                                          (sequence % kBoardEntries) * kEntryBytes);
  }
  std::byte* board_payload(int rank, std::uint64_t sequence) const {
    return reinterpret_cast<std::byte*>(&board_entry(rank, sequence)) + sizeof(BoardEntry);
  }
  // This rank's last reading of the least of its peers' `checked` (not shared).
  std::uint64_t board_floor = 0;
  // The broadcasts this rank sent as the root on the board and returned from before
  // their peers' entries were compared (board_route.cpp), oldest first, without their
  // buffers: compared at this rank's next call that is not such a broadcast, once
  // kRootRunAhead are pending, or when the communicator goes. Not shared.
  std::vector<Collective> unverified;
  // How many board broadcasts a root may send before it compares them. Comparing each
  // at the next call ties the root to its peers' previous call, a cross-core read per
  // call; a batch is compared for about the price of one, and a mismatch is still
  // found within it.
  static constexpr std::size_t kRootRunAhead = 8;
  // How many of `rank`'s first collectives it has checked against every peer: the
  // entries before that may be overwritten.
  std::atomic_ref<std::uint64_t> checked(int rank) const {
    return std::atomic_ref<std::uint64_t>(
        *reinterpret_cast<std::uint64_t*>(bases_[static_cast<std::size_t>(rank)] + kBoardOffset));
  }

 private:
  static constexpr std::size_t kLine = 64;
  static constexpr std::size_t kBoardOffset = 3 * kLine;
  static constexpr std::size_t kEntryBytes = (sizeof(BoardEntry) + kBoardPayloadBytes + kLine - 1) / kLine * kLine;
  static constexpr std::size_t kHeaderBytes = kBoardOffset + kLine + kBoardEntries * kEntryBytes;
  static_assert(sizeof(BoardEntry) + 8 == kLine, "8 bytes of data share the signature's line");

  ShmChannel() = default;
  std::atomic_ref<std::uint64_t> counter(int rank, Stage stage) const {
    return std::atomic_ref<std::uint64_t>(
        *reinterpret_cast<std::uint64_t*>(bases_[static_cast<std::size_t>(rank)] + stage * kLine));
  }

  int rank_ = 0, size_ = 0, slots_ = 0;
  std::size_t slot_bytes_ = 0, segment_bytes_ = 0;
  std::vector<std::byte*> bases_;  // mapped segments, null where not (yet) mapped
  std::uint64_t reserved_ = 0;
};

}  // namespace troupe::collectives::detail
