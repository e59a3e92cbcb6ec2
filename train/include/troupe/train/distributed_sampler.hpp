// DistributedSampler: which samples each rank sees in an epoch
// (torch.utils.data.DistributedSampler), resumable from inside an epoch.
//
// Per epoch, the indices 0..n-1 are shuffled with a generator seeded by
// (seed, epoch) -- the same permutation on every rank, a different one per epoch
// (call set_epoch at the start of each). The permutation is then made a multiple of
// the number of replicas: padded by repeating its first indices, or with drop_last
// cut at the largest multiple. Rank r takes positions r, r+R, r+2R, ... (strided, as
// PyTorch does), so the parts are disjoint apart from padding, all of equal length,
// and the k-th batch of B on every rank together is exactly the k-th batch of R*B of
// the single-rank order: R ranks x batch B see the same samples per step as one rank
// x batch R*B.
//
// Uneven shares. With SamplerOptions::global_batch = m (samples of one micro-step over
// all ranks), the epoch is cut into blocks of m positions and rank r takes the block's
// positions r, r+R, ... -- so each global batch is still the single-rank batch of m,
// and when R does not divide m the ranks' shares differ by one (64 over 3 ranks:
// 22, 21, 21). When R divides m this is exactly the plain strided split above. The
// trainer weights each rank's gradient by its share (batch_weight) so the step is the
// single-rank step.
//
// The shuffle is our own Fisher-Yates over std::mt19937_64, both fully specified by
// the C++ standard, so a permutation is the same with every compiler and library.
//
// Position: how many of this rank's indices of the epoch were consumed (advance()).
// It is the resumable part of the state: a run restored from state_dict() continues
// with the next unconsumed index of the same epoch.
//
// Another world size mid-epoch: the ranks consume in step, so after position p at R
// replicas the first p*R positions of the epoch's (padded) permutation are done. A
// sampler with R' replicas that loads that state re-splits the rest: the epoch goes on
// with the permutation from `start` = p*R on (padded or cut to a multiple of R'),
// strided over the R' ranks as usual, so every sample not yet seen is seen once and
// the k-th global batch of G samples is the same set as it would have been at R (for
// the same G, with `start` a multiple of G). The next set_epoch starts from 0 again.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/nn/state_dict.hpp"

namespace troupe::train {

struct SamplerOptions {
  bool shuffle = true;
  std::uint64_t seed = 0;
  // Drop the tail that does not divide evenly instead of padding to equal parts.
  bool drop_last = false;
  // Samples per micro-step over all ranks (see "Uneven shares"); 0: plain strided split.
  std::int64_t global_batch = 0;
};

class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, int num_replicas, int rank, SamplerOptions options = {});

  // Starts epoch `epoch` from its beginning.
  void set_epoch(std::int64_t epoch);
  std::int64_t epoch() const { return epoch_; }

  std::int64_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  const SamplerOptions& options() const { return options_; }
  // This rank's indices per epoch, and the epoch's positions over all ranks.
  std::int64_t num_samples() const { return num_samples_; }
  std::int64_t total_size() const { return total_size_; }
  // This rank's part of a full global batch: global_batch / R, one more on the first
  // global_batch % R ranks; the DataLoader's batch size. Needs global_batch.
  std::int64_t local_batch() const;
  // The factor on this rank's mean-loss gradient for its batch of `count` samples that
  // began at this rank's position `position`, so that the ranks' average is the mean
  // over the global batch: R * count / (the global batch's size). 1 without
  // global_batch or when the shares are equal.
  double batch_weight(std::int64_t position, std::int64_t count) const;

  // This rank's indices for the current epoch, all of them.
  const std::vector<std::int64_t>& indices() const { return indices_; }
  // The ones not yet consumed.
  std::vector<std::int64_t> remaining() const;
  // Consumed indices of this epoch; advance() moves it on.
  std::int64_t position() const { return position_; }
  void advance(std::int64_t count);
  bool exhausted() const { return position_ >= num_samples_; }
  // The next `count` indices (fewer at the end), consumed.
  std::vector<std::int64_t> take(std::int64_t count);

  // Where in the epoch's permutation this rank's split begins: 0, unless the epoch was
  // re-split after a state from another world size was loaded mid-epoch.
  std::int64_t start() const { return start_; }

  // seed, epoch, start, position, consumed (positions of the epoch done over all ranks,
  // from start: the same on every rank) and the shape it was made for (dataset size,
  // replicas, drop_last, shuffle, global_batch) as 0-dim i64 tensors. Loading checks the shape against this
  // sampler's, so a checkpoint from another data set is refused; one from another
  // world size re-splits the rest of the epoch (see above), or at an epoch boundary
  // (position 0 or the epoch's end, which loads as this sampler's end) simply loads.
  nn::StateDict state_dict() const;
  void load_state_dict(const nn::StateDict& dict);

 private:
  // Splits the epoch's permutation from start_ on over the replicas.
  void build_indices();
  static std::int64_t samples_per_replica(std::int64_t count, std::int64_t replicas, bool drop_last);
  // Positions of the epoch consumed over all ranks when this rank is at `position`.
  std::int64_t consumed(std::int64_t position) const;

  std::int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  SamplerOptions options_;
  std::int64_t num_samples_ = 0;
  std::int64_t total_size_ = 0;
  std::int64_t epoch_ = 0;
  std::int64_t start_ = 0;
  std::int64_t position_ = 0;
  std::vector<std::int64_t> indices_;
};

// The permutation of 0..n-1 for (seed, epoch): what every rank derives its part from.
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

}  // namespace troupe::train
