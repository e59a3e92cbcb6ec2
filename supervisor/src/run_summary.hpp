// RunSummary: troupe-run's account of a run's failures, for the closing summary and
// the "finish" event: each failure's cause, where the job was when it failed and
// where the relaunch resumed, the steps done twice and the time lost.
//
// "Time lost" for a failure runs from the last progress any rank reported before it
// to the first step reported after the relaunch (or to the end, when none came);
// "steps redone" is the furthest step reported before the failure minus the step the
// relaunch resumed at. Both rest on progress as heartbeats carry it, so they are
// accurate to a heartbeat interval.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "heartbeat_server.hpp"

namespace troupe::supervisor {

class RunSummary {
 public:
  // A failure seen at `now`; the job last made progress at `last_progress`. If the
  // previous failure's relaunch failed before its first step, the downtime is one
  // stretch: the previous failure's loss ends, and this one's starts, at `now`.
  void failed(std::string cause, std::string detail, std::optional<std::uint64_t> furthest_step,
              Clock::time_point last_progress, Clock::time_point now);
  // The first step of a relaunch; returns true when it resumed after a failure.
  bool resumed(std::uint64_t step, Clock::time_point now);
  std::size_t failures() const { return failures_.size(); }
  const std::string& last_cause() const { return failures_.back().cause; }
  // How many failures of each cause so far.
  std::map<std::string, std::uint64_t> causes() const;

  struct Totals {
    double lost_s = 0;
    std::uint64_t steps_redone = 0;
    std::vector<std::string> causes;
  };
  // Closes the account at `now` (a failure never resumed loses time up to now).
  Totals close(Clock::time_point now);
  // The summary lines (after close()).
  std::string text(const std::string& outcome, int restarts, double total_s, int exit_code) const;

 private:
  struct Failure {
    std::string cause;
    std::string detail;
    std::optional<std::uint64_t> failed_at_step;
    std::optional<std::uint64_t> resumed_at_step;
    Clock::time_point last_progress;
    double lost_s = 0;
    std::uint64_t redone() const;
  };
  std::vector<Failure> failures_;
  Totals totals_;
};

}  // namespace troupe::supervisor
