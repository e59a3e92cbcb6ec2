// Supervisor: what the heartbeat server reports, the watchdog tick (heartbeats, hangs,
// stragglers, regrowth), dumps, refusals and the metrics scrape.
#include "supervisor_impl.hpp"

#include <algorithm>

namespace troupe::supervisor {

// ---- HeartbeatServer::Listener ----
void Supervisor::Impl::on_rank_up(const RankStatus& rank) {
  const std::string unwatched = local_.watch(rank, [this] {
    if (state_ == State::stopping && local_.all_exited()) ranks_exited();
  });
  if (!unwatched.empty() && !said_unwatched_) {  // once a launch: it is the same for every rank
    said_unwatched_ = true;
    say("not signalling rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + " on " + rank.host +
        ") directly: " + unwatched + "; stopping the job waits for mpirun instead");
  }
  pool_->rank_registered(rank.rank, rank.host);
  JsonFields fields = {{"restart", restart_}, {"rank", rank.rank},
                       {"host", rank.host},   {"pid", static_cast<unsigned>(rank.pid)},
                       {"peer", rank.peer},   {"since_launch_s", seconds(Clock::now() - launched_)}};
  if (!unwatched.empty()) fields.emplace_back("not_signalled", unwatched);
  events_->write("rank_up", fields);
}

void Supervisor::Impl::on_rank_lost(const RankStatus& rank, const std::string& reason) {
  if (state_ == State::stopping) {
    // A rank behind a partition is silent rather than gone, fences itself, and its
    // daemon is out of mpirun's reach: waiting for mpirun would only wait out --grace.
    if (every_rank_gone(server_->ranks(), Clock::now(),
                        std::chrono::duration_cast<Clock::duration>(options_.heartbeat_timeout)))
      ranks_exited();
    return;
  }
  const auto error = rank_errors_.find(rank.rank);
  JsonFields fields = {{"rank", rank.rank}};
  if (error != rank_errors_.end()) fields.emplace_back("error", error->second);
  fail("rank_lost",
       "rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + " on " + rank.host + "): " + reason +
           at_step(rank) + (error != rank_errors_.end() ? ", failing with: " + error->second : ""),
       std::move(fields), Blame::on(rank.host));
}

// Every refusal is counted; only so many are written out (refusal_limiter.hpp), the
// rest summed up once their window closes.
void Supervisor::Impl::on_refusal(const Refusal& refusal) {
  const auto now = Clock::now();
  report_held_refusals(now);
  if (refusal_lines_.admit(now, refusal)) say("refused a connection from " + refusal.peer + ": " + refusal.reason);
  if (refusal_events_.admit(now, refusal))
    events_->write("refused",
                   {{"peer", refusal.peer}, {"kind", refusal_name(refusal.kind)}, {"reason", refusal.reason}});
  schedule_refusal_report();
}

void Supervisor::Impl::on_notice(const RankStatus& rank, const Notice& notice) {
  say("rank " + std::to_string(rank.rank) + " on " + rank.host + ": " + notice.text);
  events_->write(std::string(notice_name(notice.kind)),
                 {{"restart", restart_}, {"rank", rank.rank}, {"host", rank.host}, {"text", notice.text}});
  if (notice.kind == NoticeKind::error) rank_errors_[rank.rank] = notice.text;
  if (notice.kind == NoticeKind::save_failed) {
    ++save_failures_;
    ++save_failures_total_;
  }
}

void Supervisor::Impl::on_progress(const RankStatus& rank) {
  phases_.on_progress(rank, Clock::now());
  if (!rank.progress.has_step) return;
  last_progress_ = Clock::now();
  furthest_step_ = std::max(furthest_step_.value_or(0), rank.progress.step);
  if (!resumed_ && state_ == State::running) {
    resumed_ = true;
    double since_launch = seconds(Clock::now() - launched_);
    events_->write(restart_ == 0 ? "first_step" : "resume", {{"restart", restart_},
                                                             {"rank", rank.rank},
                                                             {"step", static_cast<unsigned long>(rank.progress.step)},
                                                             {"since_launch_s", since_launch}});
    if (summary_.resumed(rank.progress.step, Clock::now()))
      say("resumed at step " + std::to_string(rank.progress.step) + ", " + decimal(since_launch) + " s after relaunch");
  }
}

// What --metrics serves, read at each scrape (job_metrics.hpp).
JobMetrics Supervisor::Impl::job_metrics() const {
  static constexpr const char* kStates[] = {"running", "stopping", "waiting_for_host", "backing_off", "finished"};
  const Clock::time_point now = Clock::now();
  JobMetrics m;
  m.run_id = run_id_;
  m.state = kStates[static_cast<int>(state_)];
  m.uptime_s = seconds(now - started_);
  m.restarts = restart_;
  m.world_size = static_cast<int>(server_->ranks().size());
  m.failures = summary_.causes();
  m.save_failures = save_failures_total_;
  m.furthest_step = furthest_step_;
  m.ranks = rank_metrics(server_->ranks(), phases_, stragglers_, now);
  m.phases = phases_.all_totals();
  if (!options_.checkpoint_dir.empty()) m.actors = actor_metrics(options_.checkpoint_dir);
  return m;
}

// The summaries of refusal windows that are over (all of them with `force`).
void Supervisor::Impl::report_held_refusals(Clock::time_point now, bool force) {
  if (auto held = refusal_lines_.end_window(now, force))
    say(std::to_string(held->count) + " more refusal(s) in the last " + decimal(seconds(held->span), 1) +
        " s (reasons: " + held->reasons() + ")");
  if (auto held = refusal_events_.end_window(now, force))
    events_->write("refused_summary", {{"count", static_cast<unsigned long>(held->count)},
                                       {"period_s", seconds(held->span)},
                                       {"reasons", Json::raw(held->reasons_json())}});
}

// A summary is due when a window that held refusals back closes, even if no refusal
// follows to notice it.
void Supervisor::Impl::schedule_refusal_report() {
  if (refusal_report_due_ || state_ == State::finished) return;
  std::optional<Clock::time_point> due;
  for (const RefusalLimiter* limiter : {&refusal_lines_, &refusal_events_})
    if (limiter->held() > 0) due = std::min(due.value_or(limiter->window_end()), limiter->window_end());
  if (!due) return;
  refusal_report_due_ = true;
  refusal_timer_.expires_at(*due);
  refusal_timer_.async_wait([this](boost::system::error_code ec) {
    refusal_report_due_ = false;
    if (ec) return;
    report_held_refusals(Clock::now());
    schedule_refusal_report();
  });
}

std::string Supervisor::Impl::at_step(const RankStatus& rank) {
  std::string s;
  if (rank.progress.has_step) s += ", last reported step " + std::to_string(rank.progress.step);
  if (rank.progress.has_sequence) s += ", collective " + std::to_string(rank.progress.sequence);
  return s;
}

// The watchdog: heartbeats and progress of every live rank, a few times per timeout.
void Supervisor::Impl::schedule_tick() {
  double period =
      std::clamp(std::min(options_.heartbeat_timeout.count(), options_.hang_timeout.count()) / 20, 0.01, 0.25);
  tick_.expires_after(std::chrono::duration_cast<Clock::duration>(Seconds(period)));
  tick_.async_wait([this](boost::system::error_code ec) {
    if (ec || state_ != State::running) return;
    check_ranks();
    if (state_ == State::running) schedule_tick();
  });
}

void Supervisor::Impl::check_ranks() {
  auto now = Clock::now();
  auto heartbeat_timeout = std::chrono::duration_cast<Clock::duration>(options_.heartbeat_timeout);
  auto hang_timeout = std::chrono::duration_cast<Clock::duration>(options_.hang_timeout);
  const RankStatus* stuck = nullptr;
  // Every rank runs the same program: once one has registered, a rank that has not
  // within the hang timeout of the launch is stuck before it could (in MPI_Init, say).
  const auto& ranks = server_->ranks();
  bool any = std::any_of(ranks.begin(), ranks.end(), [](const RankStatus& r) { return r.registered; });
  if (any && now - launched_ > hang_timeout) {
    std::string missing;
    for (const auto& rank : ranks)
      if (!rank.registered) missing += (missing.empty() ? "" : ", ") + std::to_string(rank.rank);
    if (!missing.empty())
      return fail("hang",
                  "rank(s) " + missing + " never registered within the hang timeout of " +
                      decimal(options_.hang_timeout.count()) + " s after launch",
                  {}, Blame::last_blamed());
  }
  const Phase phase = deadline_phase(ranks, options_);
  auto deadline = std::chrono::duration_cast<Clock::duration>(phase_timeout(options_, phase));
  for (const auto& rank : ranks) {
    if (!rank.registered || !rank.connected || rank.said_goodbye) continue;
    if (now - rank.last_heard > heartbeat_timeout)
      return fail("heartbeat_timeout",
                  "rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + " on " + rank.host +
                      ") sent no heartbeat for " + decimal(seconds(now - rank.last_heard)) + " s" + at_step(rank),
                  {{"rank", rank.rank}}, Blame::on(rank.host));
    if (now - rank.last_progress > deadline && !stuck) stuck = &rank;
  }
  if (stuck) return report_hang(now, phase);
  report_stragglers(now);
  if (!regrow_host_.empty() && newest_checkpoint_step(options_.checkpoint_dir) > regrow_after_step_) regrow();
}

// A slow rank is named, not restarted: the job is right, only slower (straggler_watch.hpp).
void Supervisor::Impl::report_stragglers(Clock::time_point now) {
  for (const auto& change : stragglers_.update(server_->ranks(), now)) {
    const std::string who = "rank " + std::to_string(change.rank) + " on " + change.host;
    if (change.straggling)
      say("straggler: " + who + " works " + decimal(change.work_ms) + " ms per step, " + decimal(change.slower, 1) +
          "x the ranks' median of " + decimal(change.median_ms) + " ms (step " + std::to_string(change.step) +
          "); every rank waits for it");
    else
      say(who + " is no longer a straggler (" + decimal(change.work_ms) + " ms per step, median " +
          decimal(change.median_ms) + " ms)");
    events_->write(change.straggling ? "straggler" : "straggler_over",
                   {{"restart", restart_},
                    {"rank", change.rank},
                    {"host", change.host},
                    {"work_ms", change.work_ms},
                    {"median_ms", change.median_ms},
                    {"slower", change.slower},
                    {"step", static_cast<unsigned long>(change.step)}});
  }
}

void Supervisor::Impl::host_back(const std::string& host) {
  regrow_host_ = host;
  regrow_after_step_ = newest_checkpoint_step(options_.checkpoint_dir);
  say("host " + host + " answers again; growing back onto it after the next checkpoint");
  events_->write("host_back",
                 {{"restart", restart_}, {"host", host}, {"checkpoint_step", static_cast<long>(regrow_after_step_)}});
}

// The checkpoint the relaunch resumes from is on disk: stop and relaunch with the host.
void Supervisor::Impl::regrow() {
  if (state_ != State::running) return;
  state_ = State::stopping;
  regrowing_ = true;
  tick_.cancel();
  const long long step = newest_checkpoint_step(options_.checkpoint_dir);
  say("checkpoint of step " + std::to_string(step) + " written; stopping to grow back onto " + regrow_host_);
  events_->write("regrow", {{"restart", restart_},
                            {"host", regrow_host_},
                            {"checkpoint_step", static_cast<long>(step)},
                            {"np_before", pool_->np()}});
  stop_job();
}

// Five heartbeats per heartbeat timeout, and at most 0.1 s apart: progress is seen
// when a heartbeat carries it, so this bounds how late a hang is reported and how
// stale the step in a failure report is. A heartbeat costs a rank ~0.1 ms of CPU
// here (bench/run supervisor), so 10 a second stay far below 1% of a core.
Clock::duration Supervisor::Impl::heartbeat_interval() const {
  double interval_s = std::min({options_.heartbeat_timeout.count() / 5, options_.hang_timeout.count() / 4, 0.1});
  return std::chrono::milliseconds(std::max<long>(10, std::lround(interval_s * 1000)));
}

void Supervisor::Impl::report_hang(Clock::time_point now, Phase phase) {
  if (dumps_ && dumps_->busy()) return;  // the verdict is in; the ranks are writing their dumps
  HangReport report = describe_hang(server_->ranks(), now, phase_timeout(options_, phase), phase);
  collect_dumps("hang", [this, report](const std::string& dumps) {
    fail("hang", report.detail + dumps, {{"ranks", Json::raw(report.ranks_json)}});
  });
}

// SIGUSR1: where is every rank now? The job goes on.
void Supervisor::Impl::wait_for_dump_signal() {
  dump_signal_.async_wait([this](boost::system::error_code ec, int) {
    if (ec) return;
    if (state_ == State::running && !(dumps_ && dumps_->busy())) collect_dumps("SIGUSR1", [](const std::string&) {});
    wait_for_dump_signal();
  });
}

// Asks every rank for its flight record and stacks (rank_dump.hpp), prints where each
// rank is once they have written them (DumpCollector), and then calls `then` with a
// note naming the folder ("" without --checkpoint-dir).
void Supervisor::Impl::collect_dumps(const std::string& why, std::function<void(const std::string&)> then) {
  if (!dumps_) return then("");
  dumps_->collect(*server_, [this, why, then = std::move(then)](const std::vector<std::string>& lines, double took) {
    const std::string folder = dump_folder(options_.checkpoint_dir);
    say(why + ": where each rank is (" + decimal(took) + " s to dump; files in " + folder + "):");
    std::string json = "[";
    for (const auto& line : lines) {
      std::cerr << "  " << line << "\n";
      json += (json.size() > 1 ? "," : "") + json_string(line);
    }
    events_->write("dump", {{"restart", restart_}, {"why", why}, {"folder", folder}, {"ranks", Json::raw(json + "]")}});
    then("; stacks and flight records in " + folder);
  });
}

}  // namespace troupe::supervisor
