// What troupe-run exports for Prometheus (--metrics, metrics_server.hpp): the job's
// state, restarts and failures, each rank's progress, and the actors' mailboxes. The
// list of metrics, with their types and labels, is docs/OBSERVABILITY.md's.
//
// JobMetrics is a plain snapshot that the supervisor fills at each scrape;
// prometheus_text renders it. PhaseClock keeps what no single heartbeat carries: how
// long each phase took (checkpoint saves and loads) and each rank's step rate.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "heartbeat_server.hpp"
#include "straggler_watch.hpp"

namespace troupe::supervisor {

// Time spent in each phase, summed over ranks, and each rank's recent step rate. Fed
// from the heartbeat server's progress callbacks, on troupe-run's thread.
class PhaseClock {
 public:
  struct Totals {
    std::uint64_t count = 0;  // phases ended (a save ended on every rank counts once per rank)
    double sum_s = 0;
    double last_s = 0;
  };
  // Step rates are over about this much time.
  static constexpr Clock::duration kRateWindow = std::chrono::seconds(5);

  void on_progress(const RankStatus& rank, Clock::time_point now);
  // A new launch: the ranks' phases and rates start over (the totals do not).
  void begin_launch();
  const Totals& totals(Phase phase) const { return totals_[static_cast<std::size_t>(phase)]; }
  const std::array<Totals, kPhases>& all_totals() const { return totals_; }
  // Steps a second over the last kRateWindow; 0 before two reports.
  double steps_per_second(int rank) const;

 private:
  struct Track {
    Phase phase = Phase::startup;
    Clock::time_point since{};
    std::deque<std::pair<Clock::time_point, std::uint64_t>> steps;
  };
  std::map<int, Track> ranks_;
  std::array<Totals, kPhases> totals_{};
};

struct RankMetrics {
  int rank = 0;
  std::string host;
  bool connected = false;
  std::optional<std::uint64_t> step;
  Phase phase = Phase::startup;
  double heartbeat_age_s = 0;
  double steps_per_second = 0;
  std::optional<double> work_per_step_s;  // over the straggler watch's last window
  std::optional<double> straggler_ratio;  // that, over the ranks' lower median
};

struct ActorMetrics {  // from the ranks' status snapshots (status_view.hpp)
  int rank = 0;
  std::string actor;  // its label: "Counter 'c'", "TrainWorker<...> #1"
  std::string state;
  std::uint64_t mailbox_depth = 0;
  std::uint64_t calls_served = 0;
  int restarts = 0;
};

struct JobMetrics {
  std::string run_id;
  std::string state;  // running, stopping, waiting_for_host, backing_off, finished
  double uptime_s = 0;
  int restarts = 0;
  int world_size = 0;
  std::map<std::string, std::uint64_t> failures;  // by cause, as the events log names them
  std::uint64_t save_failures = 0;
  std::optional<std::uint64_t> furthest_step;
  std::vector<RankMetrics> ranks;
  std::array<PhaseClock::Totals, kPhases> phases{};
  std::vector<ActorMetrics> actors;
};

// Each registered rank's figures: the heartbeat server's view, the phase clock's rates
// and the straggler watch's work per step.
std::vector<RankMetrics> rank_metrics(const std::vector<RankStatus>& ranks, const PhaseClock& phases,
                                      const StragglerWatch& stragglers, Clock::time_point now);
// The actors of the ranks still running, from their status snapshots (status_view.hpp)
// under the job's --checkpoint-dir.
std::vector<ActorMetrics> actor_metrics(const std::string& checkpoint_dir);

// The Prometheus text exposition format (0.0.4) of `m`.
std::string prometheus_text(const JobMetrics& m);

}  // namespace troupe::supervisor
