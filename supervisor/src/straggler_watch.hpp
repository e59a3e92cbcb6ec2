// StragglerWatch: names the rank that makes a data-parallel job slow.
//
// In synchronous training every rank steps at the pace of the slowest, so step times
// are equal everywhere and cannot tell the slow rank apart. What differs is a rank's
// own work per step -- its step time less the time it waited for peers inside
// collectives (Heartbeat::work_us / work_steps): a straggler works longest and waits
// least. For each rank the watch takes its work per step over a window of at least
// `window` and a few steps, and compares it with the lower median over the ranks (so
// that with two ranks the healthy one is the reference). A rank at `ratio` times the
// median or more, on two windows in a row, becomes a straggler; it stops being one
// after two windows below the ratio. Each change is returned once, for the events log
// and stderr; the job is not restarted (a slow node still computes the right result).
//
// Only troupe-run's thread uses it; no locks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "heartbeat_server.hpp"

namespace troupe::supervisor {

class StragglerWatch {
 public:
  // ratio <= 0 turns the watch off.
  explicit StragglerWatch(double ratio, Clock::duration window = std::chrono::seconds(2), std::uint64_t min_steps = 3);

  // A new launch: every rank's history is forgotten.
  void begin_launch(int world_size);

  struct Change {
    int rank = 0;
    std::string host;
    bool straggling = false;  // true: became a straggler; false: no longer one
    double work_ms = 0;       // its work per step over the last window
    double median_ms = 0;     // the ranks' lower median
    double slower = 0;        // work_ms / median_ms
    std::uint64_t step = 0;   // the step it last reported
  };
  // Reads every rank's totals and returns the changes since the last call.
  std::vector<Change> update(const std::vector<RankStatus>& ranks, Clock::time_point now);

  bool straggling(int rank) const;
  // The rank's work per step over its last full window, and the ranks' lower median
  // of those, in ms; none before the first windows close (or with the watch off).
  std::optional<double> work_ms(int rank) const;
  std::optional<double> median_ms() const { return median_ms_ > 0 ? std::optional(median_ms_) : std::nullopt; }
  double ratio() const { return ratio_; }

 private:
  struct Track {
    Clock::time_point since{};
    std::uint64_t us = 0, steps = 0;  // totals at `since`
    bool started = false;
    double per_step_ms = 0;    // over the last full window; 0: none yet
    bool fresh = false;        // per_step_ms is from a window that closed in this update
    int above = 0, below = 0;  // windows in a row at or above / below the ratio
    bool straggling = false;
  };
  double ratio_;
  Clock::duration window_;
  std::uint64_t min_steps_;
  std::vector<Track> tracks_;
  double median_ms_ = 0;
};

}  // namespace troupe::supervisor
