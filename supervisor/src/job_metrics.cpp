#include "job_metrics.hpp"

#include <cstdio>

#include "status_view.hpp"

namespace troupe::supervisor {

void PhaseClock::on_progress(const RankStatus& rank, Clock::time_point now) {
  auto [it, fresh] = ranks_.try_emplace(rank.rank);
  Track& t = it->second;
  if (fresh) {
    t.phase = rank.progress.phase;
    t.since = now;
  } else if (rank.progress.phase != t.phase) {
    Totals& ended = totals_[static_cast<std::size_t>(t.phase)];
    ended.last_s = std::chrono::duration<double>(now - t.since).count();
    ended.sum_s += ended.last_s;
    ++ended.count;
    t.phase = rank.progress.phase;
    t.since = now;
  }
  if (!rank.progress.has_step) return;
  if (!t.steps.empty() && rank.progress.step < t.steps.back().second) t.steps.clear();  // rewound: a new process
  t.steps.emplace_back(now, rank.progress.step);
  while (t.steps.size() > 2 && now - t.steps[1].first >= kRateWindow) t.steps.pop_front();
}

void PhaseClock::begin_launch() { ranks_.clear(); }

double PhaseClock::steps_per_second(int rank) const {
  const auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.steps.size() < 2) return 0;
  const auto& [t0, s0] = it->second.steps.front();
  const auto& [t1, s1] = it->second.steps.back();
  const double seconds = std::chrono::duration<double>(t1 - t0).count();
  return seconds > 0 ? static_cast<double>(s1 - s0) / seconds : 0;
}

std::vector<RankMetrics> rank_metrics(const std::vector<RankStatus>& ranks, const PhaseClock& phases,
                                      const StragglerWatch& stragglers, Clock::time_point now) {
  std::vector<RankMetrics> out;
  const std::optional<double> median = stragglers.median_ms();
  for (const RankStatus& r : ranks) {
    if (!r.registered) continue;
    RankMetrics rank;
    rank.rank = r.rank;
    rank.host = r.host;
    rank.connected = r.connected;
    rank.phase = r.progress.phase;
    rank.heartbeat_age_s = std::chrono::duration<double>(now - r.last_heard).count();
    rank.steps_per_second = phases.steps_per_second(r.rank);
    if (r.progress.has_step) rank.step = r.progress.step;
    if (const auto work = stragglers.work_ms(r.rank)) {
      rank.work_per_step_s = *work / 1000.0;
      if (median) rank.straggler_ratio = *work / *median;
    }
    out.push_back(std::move(rank));
  }
  return out;
}

std::vector<ActorMetrics> actor_metrics(const std::string& checkpoint_dir) {
  std::vector<ActorMetrics> out;
  std::vector<std::string> problems;  // `troupe-run status` reports them; a scrape need not
  for (const RankSnapshot& s : read_status(checkpoint_dir, problems))
    if (!s.finished)
      for (const ActorStatus& a : s.actors)
        out.push_back(ActorMetrics{.rank = s.rank,
                                   .actor = a.label,
                                   .state = a.state,
                                   .mailbox_depth = a.mailbox_depth,
                                   .calls_served = a.calls_served,
                                   .restarts = a.restarts});
  return out;
}

namespace {

// A label value: backslash, double quote and newline escaped, as the format asks.
std::string quoted(const std::string& value) {
  std::string out = "\"";
  for (const char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

class Writer {
 public:
  // One metric family: its HELP and TYPE lines, then its samples.
  void family(const char* name, const char* type, const char* help) {
    out_ += "# HELP " + std::string(name) + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, const std::string& labels, double value) {
    out_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(value) + "\n";
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string rank_labels(const RankMetrics& r) {
  return "rank=" + quoted(std::to_string(r.rank)) + ",host=" + quoted(r.host);
}

}  // namespace

std::string prometheus_text(const JobMetrics& m) {
  Writer w;
  w.family("troupe_run_info", "gauge", "This troupe-run; 1, its run id as a label.");
  w.sample("troupe_run_info", "run_id=" + quoted(m.run_id), 1);
  w.family("troupe_run_uptime_seconds", "gauge", "Since troupe-run started.");
  w.sample("troupe_run_uptime_seconds", "", m.uptime_s);
  w.family("troupe_run_state", "gauge", "1 for the state troupe-run is in, 0 for the others.");
  for (const char* state : {"running", "stopping", "waiting_for_host", "backing_off", "finished"})
    w.sample("troupe_run_state", "state=" + quoted(state), m.state == state ? 1 : 0);
  w.family("troupe_restarts_total", "counter", "Relaunches of the job so far.");
  w.sample("troupe_restarts_total", "", m.restarts);
  w.family("troupe_failures_total", "counter", "Failures that stopped a launch, by cause.");
  for (const auto& [cause, n] : m.failures)
    w.sample("troupe_failures_total", "cause=" + quoted(cause), static_cast<double>(n));
  w.family("troupe_checkpoint_save_failures_total", "counter", "Checkpoint saves that ranks reported failed.");
  w.sample("troupe_checkpoint_save_failures_total", "", static_cast<double>(m.save_failures));
  w.family("troupe_world_size", "gauge", "Ranks of the current launch.");
  w.sample("troupe_world_size", "", m.world_size);
  if (m.furthest_step) {
    w.family("troupe_step", "gauge", "The furthest step any rank has reported.");
    w.sample("troupe_step", "", static_cast<double>(*m.furthest_step));
  }
  w.family("troupe_phase_seconds", "summary", "Time ranks spent in each phase, per phase ended on a rank.");
  for (int p = 0; p < kPhases; ++p) {
    const auto& t = m.phases[static_cast<std::size_t>(p)];
    const std::string label = "phase=" + quoted(std::string(phase_name(static_cast<Phase>(p))));
    w.sample("troupe_phase_seconds_sum", label, t.sum_s);
    w.sample("troupe_phase_seconds_count", label, static_cast<double>(t.count));
  }
  w.family("troupe_phase_last_seconds", "gauge", "How long the last phase of each kind took on a rank.");
  for (int p = 0; p < kPhases; ++p)
    if (m.phases[static_cast<std::size_t>(p)].count > 0)
      w.sample("troupe_phase_last_seconds", "phase=" + quoted(std::string(phase_name(static_cast<Phase>(p)))),
               m.phases[static_cast<std::size_t>(p)].last_s);

  w.family("troupe_rank_connected", "gauge", "1 while the rank's heartbeat connection is open.");
  for (const auto& r : m.ranks) w.sample("troupe_rank_connected", rank_labels(r), r.connected ? 1 : 0);
  w.family("troupe_rank_step", "gauge", "The step the rank last reported.");
  for (const auto& r : m.ranks)
    if (r.step) w.sample("troupe_rank_step", rank_labels(r), static_cast<double>(*r.step));
  w.family("troupe_rank_phase", "gauge", "1 for the phase the rank is in, 0 for the others.");
  for (const auto& r : m.ranks)
    for (int p = 0; p < kPhases; ++p)
      w.sample("troupe_rank_phase", rank_labels(r) + ",phase=" + quoted(std::string(phase_name(static_cast<Phase>(p)))),
               static_cast<int>(r.phase) == p ? 1 : 0);
  w.family("troupe_rank_heartbeat_age_seconds", "gauge", "Since the rank's last heartbeat.");
  for (const auto& r : m.ranks) w.sample("troupe_rank_heartbeat_age_seconds", rank_labels(r), r.heartbeat_age_s);
  w.family("troupe_rank_steps_per_second", "gauge", "The rank's steps a second over the last 5 s.");
  for (const auto& r : m.ranks) w.sample("troupe_rank_steps_per_second", rank_labels(r), r.steps_per_second);
  w.family("troupe_rank_work_seconds_per_step", "gauge",
           "The rank's own work per step (step time less waits for peers), over the straggler window.");
  for (const auto& r : m.ranks)
    if (r.work_per_step_s) w.sample("troupe_rank_work_seconds_per_step", rank_labels(r), *r.work_per_step_s);
  w.family("troupe_rank_straggler_ratio", "gauge", "The rank's work per step over the ranks' lower median.");
  for (const auto& r : m.ranks)
    if (r.straggler_ratio) w.sample("troupe_rank_straggler_ratio", rank_labels(r), *r.straggler_ratio);

  if (!m.actors.empty()) {
    auto labels = [](const ActorMetrics& a) {
      return "rank=" + quoted(std::to_string(a.rank)) + ",actor=" + quoted(a.actor);
    };
    w.family("troupe_actor_mailbox_depth", "gauge", "Calls queued for the actor, not yet started.");
    for (const auto& a : m.actors)
      w.sample("troupe_actor_mailbox_depth", labels(a), static_cast<double>(a.mailbox_depth));
    w.family("troupe_actor_calls_served_total", "counter", "Calls the actor has run to their end.");
    for (const auto& a : m.actors)
      w.sample("troupe_actor_calls_served_total", labels(a), static_cast<double>(a.calls_served));
    w.family("troupe_actor_restarts_total", "counter", "Restarts of the actor by its supervisor.");
    for (const auto& a : m.actors) w.sample("troupe_actor_restarts_total", labels(a), a.restarts);
  }
  return w.take();
}

}  // namespace troupe::supervisor
