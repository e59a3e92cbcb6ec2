// SlotWriter: copies a rank's data into its shared-memory slot with plain or with
// streaming (non-temporal) stores, whichever has lately been faster.
//
// Why: a slot's lines were last read by the peers, so they sit in the peers' caches
// and every plain store must first invalidate them there. With both ranks' cores in
// one cache complex that costs nothing (plain copies run 10-20 GB/s on our 2-core
// EPYC VMs, and the peer then reads the slot from cache); when the hypervisor places
// them in different complexes, each invalidation crosses the fabric and the same
// copies fall to 2-5 GB/s (bench/core_placement_probe: cache-line round trip 70-170 ns
// vs about 530 ns, the placement changing every few seconds). Streaming stores skip the
// invalidations and keep 9-25 GB/s in either placement, but the peer then
// reads from memory rather than cache. Neither wins everywhere and the placement
// changes under a running job, so the writer times its copies and uses streaming
// stores only while they time kStreamingMargin times faster than plain ones, trying
// the kind not in use now and then (one copy in kExploreEvery) so that it notices
// when the placement changes back. The margin is wide because the peers' cost is
// invisible here: with 2x, a DDP run's gradient buckets went mostly to streaming
// stores (93% of copies in one run) and its allreduces took 12.8-19.3 ms, against
// 11.0-12.3 ms with plain stores alone (5 alternations, bench/ddp_bench --model large).
//
// Local to one rank: peers need not agree on the kind, as streaming stores are fenced
// before the round's counter is published.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::collectives::detail {

class SlotWriter {
 public:
  void copy(std::byte* slot, const std::byte* data, std::size_t bytes);

  // Copies this small are plain and untimed: the clock reads would cost more than
  // the choice saves.
  static constexpr std::size_t kTimedBytes = std::size_t{64} << 10;
  static constexpr std::uint32_t kExploreEvery = 32;
  static constexpr double kStreamingMargin = 3.0;
  // Per copy of the same kind, the best rate seen so far counts this much less.
  static constexpr double kDecay = 0.9;

 private:
  // Bytes per nanosecond: the best of recent copies, decaying; 0 until measured.
  double rate_[2] = {0, 0};  // [plain, streaming]
  bool streaming_ = false;
  std::uint32_t copies_ = 0;
};

// memcpy whose stores bypass the cache, fenced so that a later release store orders
// after them.
void copy_streaming(std::byte* dst, const std::byte* src, std::size_t bytes);

}  // namespace troupe::collectives::detail
