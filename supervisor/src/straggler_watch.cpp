#include "straggler_watch.hpp"

#include <algorithm>

namespace troupe::supervisor {

StragglerWatch::StragglerWatch(double ratio, Clock::duration window, std::uint64_t min_steps)
    : ratio_(ratio), window_(window), min_steps_(std::max<std::uint64_t>(1, min_steps)) {}

void StragglerWatch::begin_launch(int world_size) {
  tracks_.assign(static_cast<std::size_t>(world_size), Track{});
  median_ms_ = 0;
}

bool StragglerWatch::straggling(int rank) const {
  return rank >= 0 && static_cast<std::size_t>(rank) < tracks_.size() &&
         tracks_[static_cast<std::size_t>(rank)].straggling;
}

std::vector<StragglerWatch::Change> StragglerWatch::update(const std::vector<RankStatus>& ranks,
                                                           Clock::time_point now) {
  std::vector<Change> changes;
  if (ratio_ <= 0 || ranks.size() < 2 || tracks_.size() != ranks.size()) return changes;
  // Close each rank's window once it spans `window_` and min_steps_ steps.
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const Heartbeat& beat = ranks[r].progress;
    Track& t = tracks_[r];
    t.fresh = false;
    if (!ranks[r].registered || !ranks[r].connected) continue;
    if (!t.started || beat.work_steps < t.steps) {  // a counter that went back is a new process
      t = Track{.since = now, .us = beat.work_us, .steps = beat.work_steps, .started = true};
      continue;
    }
    const std::uint64_t steps = beat.work_steps - t.steps;
    if (now - t.since < window_ || steps < min_steps_) continue;
    t.per_step_ms =
        static_cast<double>(beat.work_us - std::min(beat.work_us, t.us)) / 1000.0 / static_cast<double>(steps);
    t.fresh = true;
    t.since = now;
    t.us = beat.work_us;
    t.steps = beat.work_steps;
  }
  // The reference: the lower median of the ranks that have a figure.
  std::vector<double> figures;
  for (const Track& t : tracks_)
    if (t.per_step_ms > 0) figures.push_back(t.per_step_ms);
  if (figures.size() < 2) return changes;
  std::sort(figures.begin(), figures.end());
  const double median = figures[(figures.size() - 1) / 2];
  median_ms_ = median;
  for (std::size_t r = 0; r < tracks_.size(); ++r) {
    Track& t = tracks_[r];
    if (!t.fresh) continue;
    const double slower = t.per_step_ms / median;
    if (slower >= ratio_) {
      t.below = 0;
      ++t.above;
    } else {
      t.above = 0;
      ++t.below;
    }
    const bool change = t.straggling ? t.below >= 2 : t.above >= 2;
    if (!change) continue;
    t.straggling = !t.straggling;
    changes.push_back(Change{.rank = static_cast<int>(r),
                             .host = ranks[r].host,
                             .straggling = t.straggling,
                             .work_ms = t.per_step_ms,
                             .median_ms = median,
                             .slower = slower,
                             .step = ranks[r].progress.step});
  }
  return changes;
}

std::optional<double> StragglerWatch::work_ms(int rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= tracks_.size() ||
      tracks_[static_cast<std::size_t>(rank)].per_step_ms <= 0)
    return std::nullopt;
  return tracks_[static_cast<std::size_t>(rank)].per_step_ms;
}

}  // namespace troupe::supervisor
