// The shared-memory route (ShmRoute): allreduce, reduce, reduce_scatter, allgather and
// broadcast when every rank is on one node -- asynchronous calls, and blocking ones
// too large for the small blocking routes -- run as a ShmCollective, through a
// ShmChannel (shm_channel.hpp), in rounds of one slot each.
//
// A round moves one piece of the collective through three stages, each ending with
// this rank publishing its counter:
//
//   post     copy my piece of the input into my slot
//            (allreduce, reduce, allgather, broadcast root: the next chunk of the
//             input; reduce_scatter: the next chunk of each of the n blocks, side by side)
//   reduce   once every rank posted: combine my share of the piece across all slots
//            (allreduce, reduce: sub-block r of the chunk, written back into my own
//             slot; reduce_scatter: my block's chunk, written straight into the output)
//   gather   once every rank reduced: copy what I need from the slots into my output
//            (allreduce, and reduce on its root: every rank's reduced sub-block;
//             allgather: every rank's chunk; broadcast: the root's chunk); then I have
//             consumed the round.
//
// A reduce is thus an allreduce whose result only the root copies out: the same bits
// as an allreduce of the same data, with (n-1)/n of the copying saved.
//
// Up to `slots` rounds are in flight, so copying, reducing and gathering of
// consecutive rounds overlap across the ranks, and every piece is read by the peers
// while it is still in cache. Each reduced element is computed by exactly one rank
// in rank order 0..n-1 and copied by the rest, so every rank holds the same bits (a
// sum of f16/bf16 rounds to 16 bits n-1 times, as the ring does).
//
// progress() never blocks: a stage whose peers are not there yet is left for the
// next call. A peer that never comes leaves its counter behind, which waiting_on()
// names when the engine's timeout fires.
//
// The proof runs beside the rounds, on the channel's signature board: the call starts
// at once, and is done only when its rounds are and every peer's entry holds the same
// call (with_signature_check). Each poll of the call reads the board too, so a
// mismatch ends the call as soon as it shows there, while rounds of calls of
// different sizes still wait for each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "route.hpp"
#include "shm_channel.hpp"
#include "troupe/collectives/operation.hpp"

namespace troupe::collectives::detail {

class ShmRoute : public EngineRoute {
 public:
  explicit ShmRoute(const RouteSite& site) : EngineRoute(site, /*agree_first=*/false) {}
  std::string_view name() const override { return "shm"; }
  bool supports(const Collective& collective, bool blocking) const override;
  std::shared_ptr<Operation> run(const Collective& collective) override;
};

class ShmCollective : public Operation {
 public:
  ShmCollective(Collective collective, ShmChannel& channel);

  void start() override;
  bool progress() override;
  std::string waiting_on() const override;

 private:
  // Elements [begin, begin + length) of each rank's block for local round i.
  struct Piece {
    std::size_t begin, length;
  };
  Piece piece(std::uint64_t i) const;
  bool advance(ShmChannel::Stage stage);
  void post(std::uint64_t round);
  void reduce(std::uint64_t round);
  void gather(std::uint64_t round);
  std::size_t sub_begin(std::size_t length, int q) const;

  ShmChannel& channel_;
  const int rank_, size_;
  const std::size_t element_bytes_;
  std::size_t chunk_ = 0;  // elements per round (per block for reduce_scatter)
  std::uint64_t rounds_ = 0;
  std::uint64_t first_ = 0;         // the channel's number of my first round
  std::vector<std::byte> scratch_;  // partial sums (allreduce on ranks >= 2)
  int laggard_ = -1;                // the rank last seen behind, for waiting_on()
  ShmChannel::Stage waiting_stage_ = ShmChannel::posted;
};

}  // namespace troupe::collectives::detail
