#include "supervisor.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "dump_summary.hpp"
#include "event_log.hpp"
#include "hang_report.hpp"
#include "heartbeat_server.hpp"
#include "host_pool.hpp"
#include "host_probe.hpp"
#include "job.hpp"
#include "job_metrics.hpp"
#include "local_ranks.hpp"
#include "metrics_server.hpp"
#include "mpirun_command.hpp"
#include "refusal_limiter.hpp"
#include "run_summary.hpp"
#include "status_view.hpp"
#include "straggler_watch.hpp"
#include "troupe/error.hpp"
#include "troupe/supervisor/rank_dump.hpp"
#include "troupe/supervisor/run_environment.hpp"

namespace troupe::supervisor {

namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string decimal(double v, int digits = 2) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, v);
  return buffer;
}

}  // namespace

// Whom fail() blames (HostPool): nobody, a host, or the host blamed last (a launch
// that failed before its ranks said where they run).
struct Blame {
  enum class Kind { nobody, host, last_blamed };
  Kind kind = Kind::nobody;
  std::string host;  // Kind::host
  static Blame on(std::string host) { return host.empty() ? Blame{} : Blame{Kind::host, std::move(host)}; }
  static Blame last_blamed() { return {Kind::last_blamed, {}}; }
};

class Supervisor::Impl : public HeartbeatServer::Listener {
 public:
  explicit Impl(RunOptions options)
      : options_(std::move(options)),
        run_id_(new_run_id()),
        token_(new_run_token()),
        mpirun_(find_on_path("mpirun")),
        // SIGHUP too: a closed terminal or ssh session must stop the job in order, not
        // end troupe-run by default and leave mpirun to the parent-death signal.
        signals_(io_, SIGINT, SIGTERM, SIGHUP),
        dump_signal_(io_, SIGUSR1),
        tick_(io_),
        grace_timer_(io_),
        backoff_timer_(io_),
        host_wait_timer_(io_),
        refusal_timer_(io_),
        stragglers_(options_.straggler_ratio) {
    auto hosts = job_hosts(options_);
    choose_heartbeat_address(options_, hosts);  // throws InvalidArgument for hosts that cannot work
    pool_ = std::make_unique<HostPool>(std::move(hosts), options_.np, options_.exclude_after, options_.min_ranks);
    if (!options_.checkpoint_dir.empty()) {
      std::error_code ec;
      fs::create_directories(options_.checkpoint_dir, ec);
      if (ec)
        TROUPE_THROW(Error, "troupe-run: cannot create --checkpoint-dir '", options_.checkpoint_dir,
                     "': ", ec.message());
      options_.checkpoint_dir = fs::absolute(options_.checkpoint_dir).lexically_normal().string();
      if (options_.events_file.empty()) options_.events_file = options_.checkpoint_dir + "/troupe-run-events.jsonl";
    }
    events_ = std::make_unique<EventLog>(options_.events_file, run_id_);
    if (!options_.checkpoint_dir.empty()) dumps_ = std::make_unique<DumpCollector>(io_, options_.checkpoint_dir);
    server_ = std::make_unique<HeartbeatServer>(io_, options_.bind_host, options_.bind_port, token_, run_id_, *this);
    probe_ = std::make_unique<HostProbe>(io_, options_, mpirun_, [this](const std::string& line) { say(line); });
    RunOptions quick = options_;  // waiting for a host is on the job's critical path
    quick.probe_interval = Seconds(0.5);
    host_wait_ = std::make_unique<HostProbe>(io_, quick, mpirun_, [this](const std::string& line) { say(line); });
    address_ =
        options_.advertise.empty() ? server_->address() : options_.advertise + ":" + std::to_string(server_->port());
    if (options_.metrics)
      metrics_ = std::make_unique<MetricsServer>(io_, options_.metrics_host, options_.metrics_port,
                                                 [this] { return prometheus_text(job_metrics()); });
  }

  int run() {
    started_ = Clock::now();
    say("run " + run_id_ + ": " + std::to_string(options_.np) + " ranks, heartbeat server on " + address_ +
        (options_.events_file.empty() ? "" : ", events in " + options_.events_file) +
        (metrics_ ? ", metrics at " + metrics_->url() : ""));
    std::string command;
    for (const auto& a : options_.program) command += (command.empty() ? "" : " ") + a;
    events_->write("start", {{"np", options_.np},
                             {"program", command},
                             {"supervisor", address_},
                             {"max_restarts", options_.max_restarts},
                             {"checkpoint_dir", options_.checkpoint_dir},
                             {"hang_timeout_s", options_.hang_timeout.count()},
                             {"heartbeat_timeout_s", options_.heartbeat_timeout.count()},
                             {"metrics", metrics_ ? metrics_->url() : ""},
                             {"pid", static_cast<int>(::getpid())}});
    signals_.async_wait([this](boost::system::error_code ec, int signal) {
      if (!ec) interrupt(signal);
    });
    wait_for_dump_signal();
    launch();
    io_.run();
    return exit_code_;
  }

  // ---- HeartbeatServer::Listener ----
  void on_rank_up(const RankStatus& rank) override {
    const std::string unwatched = local_.watch(rank, [this] {
      if (state_ == State::stopping && local_.all_exited()) ranks_exited();
    });
    if (!unwatched.empty() && !said_unwatched_) {  // once a launch: it is the same for every rank
      said_unwatched_ = true;
      say("not signalling rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + " on " +
          rank.host + ") directly: " + unwatched + "; stopping the job waits for mpirun instead");
    }
    pool_->rank_registered(rank.rank, rank.host);
    JsonFields fields = {{"restart", restart_}, {"rank", rank.rank},
                         {"host", rank.host},   {"pid", static_cast<unsigned>(rank.pid)},
                         {"peer", rank.peer},   {"since_launch_s", seconds(Clock::now() - launched_)}};
    if (!unwatched.empty()) fields.emplace_back("not_signalled", unwatched);
    events_->write("rank_up", fields);
  }

  void on_rank_lost(const RankStatus& rank, const std::string& reason) override {
    if (state_ == State::stopping) {
      // A rank behind a partition is silent rather than gone, fences itself, and its
      // daemon is out of mpirun's reach: waiting for mpirun would only wait out --grace.
      if (every_rank_gone(server_->ranks(), Clock::now(),
                          std::chrono::duration_cast<Clock::duration>(options_.heartbeat_timeout)))
        ranks_exited();
      return;
    }
    fail("rank_lost",
         "rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + " on " + rank.host +
             "): " + reason + at_step(rank),
         {{"rank", rank.rank}}, Blame::on(rank.host));
  }

  // Every refusal is counted; only so many are written out (refusal_limiter.hpp), the
  // rest summed up once their window closes.
  void on_refusal(const Refusal& refusal) override {
    const auto now = Clock::now();
    report_held_refusals(now);
    if (refusal_lines_.admit(now, refusal)) say("refused a connection from " + refusal.peer + ": " + refusal.reason);
    if (refusal_events_.admit(now, refusal))
      events_->write("refused",
                     {{"peer", refusal.peer}, {"kind", refusal_name(refusal.kind)}, {"reason", refusal.reason}});
    schedule_refusal_report();
  }

  void on_notice(const RankStatus& rank, const Notice& notice) override {
    say("rank " + std::to_string(rank.rank) + " on " + rank.host + ": " + notice.text);
    events_->write(std::string(notice_name(notice.kind)),
                   {{"restart", restart_}, {"rank", rank.rank}, {"host", rank.host}, {"text", notice.text}});
    if (notice.kind == NoticeKind::save_failed) {
      ++save_failures_;
      ++save_failures_total_;
    }
  }

  void on_progress(const RankStatus& rank) override {
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
        say("resumed at step " + std::to_string(rank.progress.step) + ", " + decimal(since_launch) +
            " s after relaunch");
    }
  }

 private:
  enum class State { running, stopping, waiting_for_host, backing_off, finished };

  void say(const std::string& line) { std::cerr << "troupe-run: " << line << std::endl; }

  // What --metrics serves, read at each scrape (job_metrics.hpp).
  JobMetrics job_metrics() const {
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
  void report_held_refusals(Clock::time_point now, bool force = false) {
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
  void schedule_refusal_report() {
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

  static std::string at_step(const RankStatus& rank) {
    std::string s;
    if (rank.progress.has_step) s += ", last reported step " + std::to_string(rank.progress.step);
    if (rank.progress.has_sequence) s += ", collective " + std::to_string(rank.progress.sequence);
    return s;
  }

  void launch() {
    state_ = State::running;
    resumed_ = false;
    furthest_step_.reset();  // steps redone count from this launch's progress
    int np = pool_->np();
    server_->begin_launch(static_cast<std::uint32_t>(restart_), np);
    pool_->begin_launch();
    stragglers_.begin_launch(np);
    phases_.begin_launch();
    RunEnvironment run{address_,
                       token_,
                       run_id_,
                       static_cast<std::uint32_t>(restart_),
                       options_.checkpoint_dir,
                       std::chrono::duration_cast<std::chrono::milliseconds>(heartbeat_interval()),
                       std::chrono::milliseconds(std::lround(options_.heartbeat_timeout.count() * 1000)),
                       options_.fault,
                       options_.checkpoint_dir.empty() ? -1 : newest_checkpoint_step(options_.checkpoint_dir),
                       options_.trace_dir,
                       options_.trace_steps};
    launch_step_ = run.checkpoint_step;
    const auto liveness =
        options_.liveness_timeout.count() > 0
            ? std::chrono::milliseconds(std::max(1L, std::lround(options_.liveness_timeout.count() * 1000)))
            : std::chrono::milliseconds(0);
    auto [env, exported] = launch_environment(run, liveness);
    auto hostfile = (options_.checkpoint_dir.empty() ? fs::temp_directory_path().string() : options_.checkpoint_dir) +
                    "/troupe-run-hosts-" + run_id_;
    auto command = mpirun_command(launch_options(options_, *pool_, hostfile), mpirun_, exported,
                                  std::max(1u, std::thread::hardware_concurrency()));
    if (!options_.checkpoint_dir.empty()) clear_status(options_.checkpoint_dir);
    launched_ = Clock::now();
    launched_file_time_ = fs::file_time_type::clock::now();
    try {
      job_ = std::make_unique<Job>(io_, command, env);
    } catch (const Error& e) {
      say(e.what());
      return finish(3, std::string("could not start mpirun: ") + e.what());
    }
    local_.begin_launch(np, job_->pid());
    said_unwatched_ = false;
    std::string line;
    for (const auto& a : command) line += (line.empty() ? "" : " ") + a;
    events_->write("launch",
                   {{"restart", restart_}, {"np", np}, {"pid", static_cast<int>(job_->pid())}, {"command", line}});
    job_->on_exit([this](int status) { job_exited(status); });
    schedule_tick();
    if (options_.regrow && !pool_->excluded().empty() && regrow_host_.empty())
      probe_->start([this] { return pool_->excluded(); },
                    [this](const std::string& host) {
                      if (state_ == State::running) host_back(host);
                    });
  }

  // The watchdog: heartbeats and progress of every live rank, a few times per timeout.
  void schedule_tick() {
    double period =
        std::clamp(std::min(options_.heartbeat_timeout.count(), options_.hang_timeout.count()) / 20, 0.01, 0.25);
    tick_.expires_after(std::chrono::duration_cast<Clock::duration>(Seconds(period)));
    tick_.async_wait([this](boost::system::error_code ec) {
      if (ec || state_ != State::running) return;
      check_ranks();
      if (state_ == State::running) schedule_tick();
    });
  }

  void check_ranks() {
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
  void report_stragglers(Clock::time_point now) {
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

  // ---- regrow: probe the hosts left out; take one back at the next checkpoint ----

  void host_back(const std::string& host) {
    regrow_host_ = host;
    regrow_after_step_ = newest_checkpoint_step(options_.checkpoint_dir);
    say("host " + host + " answers again; growing back onto it after the next checkpoint");
    events_->write("host_back",
                   {{"restart", restart_}, {"host", host}, {"checkpoint_step", static_cast<long>(regrow_after_step_)}});
  }

  // The checkpoint the relaunch resumes from is on disk: stop and relaunch with the host.
  void regrow() {
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
  Clock::duration heartbeat_interval() const {
    double interval_s = std::min({options_.heartbeat_timeout.count() / 5, options_.hang_timeout.count() / 4, 0.1});
    return std::chrono::milliseconds(std::max<long>(10, std::lround(interval_s * 1000)));
  }

  void report_hang(Clock::time_point now, Phase phase) {
    if (dumps_ && dumps_->busy()) return;  // the verdict is in; the ranks are writing their dumps
    HangReport report = describe_hang(server_->ranks(), now, phase_timeout(options_, phase), phase);
    collect_dumps("hang", [this, report](const std::string& dumps) {
      fail("hang", report.detail + dumps, {{"ranks", Json::raw(report.ranks_json)}});
    });
  }

  // SIGUSR1: where is every rank now? The job goes on.
  void wait_for_dump_signal() {
    dump_signal_.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      if (state_ == State::running && !(dumps_ && dumps_->busy())) collect_dumps("SIGUSR1", [](const std::string&) {});
      wait_for_dump_signal();
    });
  }

  // Asks every rank for its flight record and stacks (rank_dump.hpp), prints where each
  // rank is once they have written them (DumpCollector), and then calls `then` with a
  // note naming the folder ("" without --checkpoint-dir).
  void collect_dumps(const std::string& why, std::function<void(const std::string&)> then) {
    if (!dumps_) return then("");
    dumps_->collect(*server_, [this, why, then = std::move(then)](const std::vector<std::string>& lines, double took) {
      const std::string folder = dump_folder(options_.checkpoint_dir);
      say(why + ": where each rank is (" + decimal(took) + " s to dump; files in " + folder + "):");
      std::string json = "[";
      for (const auto& line : lines) {
        std::cerr << "  " << line << "\n";
        json += (json.size() > 1 ? "," : "") + json_string(line);
      }
      events_->write("dump",
                     {{"restart", restart_}, {"why", why}, {"folder", folder}, {"ranks", Json::raw(json + "]")}});
      then("; stacks and flight records in " + folder);
    });
  }

  void job_exited(int status) {
    if (state_ == State::running) {
      if (status == 0) return succeed();
      const auto& ranks = server_->ranks();
      bool all = std::all_of(ranks.begin(), ranks.end(), [](const RankStatus& r) { return r.registered; });
      launch_failed_ = !all;
      fail("mpirun_exit", "mpirun " + describe_wait_status(status), {}, all ? Blame{} : Blame::last_blamed());
    }
    if (state_ != State::stopping) return;
    grace_timer_.cancel();
    kill_leftovers();
    double teardown = seconds(Clock::now() - stop_started_);
    events_->write("stopped",
                   {{"restart", restart_}, {"teardown_s", teardown}, {"mpirun", describe_wait_status(status)}});
    job_.reset();
    after_stop();
  }

  void fail(const std::string& cause, const std::string& given_detail, JsonFields fields, Blame blame = {}) {
    if (state_ != State::running) return;  // the first cause is the cause
    state_ = State::stopping;
    std::string detail = given_detail;
    // A rank that ends because a peer went silent (the actors' own liveness check
    // aborts the job within a second) is not the culprit: the silent rank's host is.
    const RankStatus* silent = longest_silent(server_->ranks(), Clock::now(), 5 * heartbeat_interval());
    if (silent && blame.kind != Blame::Kind::nobody && silent->host != blame.host) {
      detail += "; rank " + std::to_string(silent->rank) + " on " + silent->host + " had been silent for " +
                decimal(seconds(Clock::now() - silent->last_heard)) + " s";
      blame = Blame::on(silent->host);
    }
    // A rank that crashed on a signal left a dump saying where (its crash handler).
    std::string crashes = "[";
    if (!options_.checkpoint_dir.empty())
      for (const std::string& note : crash_dump_notes(options_.checkpoint_dir, launched_file_time_)) {
        detail += "; " + note;
        crashes += (crashes.size() > 1 ? "," : "") + json_string(note);
      }
    if (crashes.size() > 1) fields.emplace_back("crashes", Json::raw(crashes + "]"));
    blamed_host_.clear();
    if (blame.kind != Blame::Kind::nobody) {
      auto blamed = pool_->blame(blame.kind == Blame::Kind::last_blamed ? "" : blame.host);
      if (!blamed.empty()) fields.emplace_back("host", blamed);
      blamed_host_ = blamed;
    }
    tick_.cancel();
    summary_.failed(cause, detail, furthest_step_, last_progress_.value_or(launched_), Clock::now());
    say("failure (" + cause + "): " + detail);
    fields.insert(fields.begin(), {{"restart", restart_}, {"cause", cause}, {"detail", detail}});
    if (furthest_step_) fields.emplace_back("furthest_step", static_cast<unsigned long>(*furthest_step_));
    events_->write("failure", fields);
    stop_job();
  }

  void stop_job() {
    stop_started_ = Clock::now();
    if (!job_ || !job_->running()) {
      // mpirun already exited by itself: only stragglers of its group may be left.
      kill_leftovers();
      events_->write("stopped", {{"restart", restart_}, {"teardown_s", 0.0}});
      job_.reset();
      return after_stop();
    }
    // Ranks first: Open MPI puts each local rank in a process group of its own, and
    // mpirun takes over a second to act on a signal, so the ranks are told directly.
    local_.signal(SIGTERM);
    job_->signal_group(SIGTERM);
    server_->stop_ranks();  // ranks on other hosts too, at once
    grace_timer_.expires_after(std::chrono::duration_cast<Clock::duration>(options_.grace));
    grace_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || !job_) return;
      say("the job did not stop within --grace " + decimal(options_.grace.count()) + " s; sending SIGKILL");
      kill_leftovers();
    });
  }

  // SIGKILL to mpirun's group and to every rank of this host that registered: a rank
  // that left the group (some launchers setsid) must not outlive its job.
  void kill_leftovers() {
    if (job_) job_->signal_group(SIGKILL);
    local_.signal(SIGKILL);
  }

  // Every rank of the job is gone: mpirun has nothing left to do but report, so it is
  // killed and reaped now instead of being waited for.
  void ranks_exited() {
    if (!job_) return;
    grace_timer_.cancel();
    job_->signal_group(SIGKILL);
    job_.reset();  // reaps mpirun (SIGKILL is immediate)
    events_->write("stopped", {{"restart", restart_},
                               {"teardown_s", seconds(Clock::now() - stop_started_)},
                               {"mpirun", "killed once every rank had exited"}});
    after_stop();
  }

  void after_stop() {
    if (interrupted_) return finish(128 + interrupted_, "stopped by " + std::string(::strsignal(interrupted_)));
    int before = pool_->np();
    if (!regrow_host_.empty()) {  // back for the relaunch, whatever stopped the job
      const int np = pool_->readmit(regrow_host_);
      say("relaunching on " + std::to_string(np) + " rank(s) with host " + regrow_host_ +
          (np != before ? " (was " + std::to_string(before) + ")" : ""));
      events_->write("readmit", {{"restart", restart_ + 1}, {"host", regrow_host_}, {"np", np}, {"np_before", before}});
      regrow_host_.clear();
      before = np;
    }
    if (regrowing_) {  // not a failure: no backoff, and not one of --max-restarts
      regrowing_ = false;
      ++restart_;
      ++regrows_;
      events_->write("restart", {{"restart", restart_}, {"backoff_s", 0.0}, {"cause", "regrow"}});
      return launch();
    }
    // Not for a host the next plan leaves out anyway (--exclude-after): the job goes on without it.
    const bool leaving_out = options_.exclude_after > 0 && pool_->failures_of(blamed_host_) >= options_.exclude_after;
    if (launch_failed_ && !blamed_host_.empty() && !pool_->source().empty() && options_.host_wait.count() > 0 &&
        !leaving_out) {
      launch_failed_ = false;
      return wait_for_hosts(blamed_host_);
    }
    launch_failed_ = false;
    relaunch();
  }

  // A launch failed before its ranks registered, blamed on `blamed`. If a host the
  // next launch needs does not answer (a node down, a link still cut) that launch has
  // no chance either: wait until every one answers, the blamed one first, up to
  // --host-wait, rather than spend restarts relaunching into one.
  void wait_for_hosts(const std::string& blamed) {
    state_ = State::waiting_for_host;
    const auto started = Clock::now();
    std::vector<std::string> hosts{blamed};
    for (const auto& h : pool_->remaining())
      if (h.name != blamed && !(options_.exclude_after > 0 && pool_->failures_of(h.name) >= options_.exclude_after))
        hosts.push_back(h.name);
    say("the launch failed before its ranks started; checking that its " + std::to_string(hosts.size()) +
        " host(s) answer, " + blamed + " first");
    const auto done = [this, blamed, hosts, started](bool answered) {
      host_wait_timer_.cancel();
      const std::vector<std::string> silent = answered ? std::vector<std::string>{} : host_wait_->waiting();
      host_wait_->stop();
      const int failed = host_wait_->failed();
      const double waited = seconds(Clock::now() - started);
      std::string silent_list;
      for (const auto& h : silent) silent_list += (silent_list.empty() ? "" : ",") + h;
      events_->write("host_wait", {{"restart", restart_},
                                   {"host", blamed},
                                   {"hosts", static_cast<int>(hosts.size())},
                                   {"answered", answered},
                                   {"silent", silent_list},
                                   {"failed_probes", failed},
                                   {"waited_s", waited}});
      if (answered && failed > 0) {  // one was unreachable: not the program's failure
        ++unreachable_launches_;
        say("every host answers again after " + decimal(waited) + " s; the launch that failed is not counted " +
            "against --max-restarts");
      } else if (!answered) {
        say("host(s) " + silent_list + " did not answer within --host-wait " + decimal(options_.host_wait.count()) +
            " s");
      }
      relaunch();
    };
    host_wait_->start_all(hosts, [done] { done(true); });
    host_wait_timer_.expires_after(std::chrono::duration_cast<Clock::duration>(options_.host_wait));
    host_wait_timer_.async_wait([this, done](boost::system::error_code ec) {
      if (!ec && state_ == State::waiting_for_host) done(false);
    });
  }

  void relaunch() {
    if (interrupted_) return finish(128 + interrupted_, "stopped by " + std::string(::strsignal(interrupted_)));
    const int before = pool_->np();
    if (restart_ - regrows_ - unreachable_launches_ >= options_.max_restarts)
      return finish(1, "gave up after " + std::to_string(restart_ - regrows_ - unreachable_launches_) + " restart(s)");
    if (save_failures_ > 0) {  // the job's saves failed: is the disk still full?
      if (const std::string full = checkpoint_space_shortfall(options_.checkpoint_dir); !full.empty()) {
        events_->write("storage_full", {{"restart", restart_}, {"reason", full}});
        return finish(1, "not relaunching: " + full +
                             "; free space and run troupe-run again (it resumes from the "
                             "newest checkpoint)");
      }
      save_failures_ = 0;
    }
    auto plan = pool_->plan_next_launch();
    for (const auto& host : plan.excluded_now) {
      say("leaving out host " + host + " after " + std::to_string(pool_->failures_of(host)) +
          " failure(s) blamed on it" +
          (plan.refusal.empty() ? "; relaunching on " + std::to_string(plan.np) + " rank(s)" +
                                      (plan.np < before ? " (was " + std::to_string(before) + ")" : "")
                                : ""));
      events_->write("exclude", {{"restart", restart_ + 1},
                                 {"host", host},
                                 {"failures", pool_->failures_of(host)},
                                 {"np", plan.np},
                                 {"np_before", before}});
    }
    if (!plan.refusal.empty()) return finish(1, "cannot relaunch: " + plan.refusal);
    ++restart_;
    // A launch that saved a checkpoint made progress: the backoff starts over, as a
    // Kubernetes pod's does once it has run a while, so that the hundredth unrelated
    // failure of a long job does not wait at the cap.
    const long long newest = options_.checkpoint_dir.empty() ? -1 : newest_checkpoint_step(options_.checkpoint_dir);
    failed_in_a_row_ = newest > launch_step_ ? 1 : failed_in_a_row_ + 1;
    double backoff = std::min(60.0, options_.backoff.count() * std::pow(2.0, failed_in_a_row_ - 1));
    state_ = State::backing_off;
    say("restart " + std::to_string(restart_ - regrows_ - unreachable_launches_) + " of " +
        std::to_string(options_.max_restarts) + " in " + decimal(backoff) + " s");
    events_->write("restart", {{"restart", restart_},
                               {"backoff_s", backoff},
                               {"failed_in_a_row", failed_in_a_row_},
                               {"cause", summary_.last_cause()}});
    backoff_timer_.expires_after(std::chrono::duration_cast<Clock::duration>(Seconds(backoff)));
    backoff_timer_.async_wait([this](boost::system::error_code ec) {
      if (!ec && state_ == State::backing_off) launch();
    });
  }

  void interrupt(int signal) {
    if (interrupted_) {  // a second Ctrl-C: no more grace
      kill_leftovers();
      return;
    }
    interrupted_ = signal;
    signals_.async_wait([this](boost::system::error_code ec, int s) {
      if (!ec) interrupt(s);
    });
    say(std::string("got ") + ::strsignal(signal) + "; stopping the job (no restart)");
    events_->write("interrupt", {{"signal", signal}, {"restart", restart_}});
    if (state_ == State::running) {
      state_ = State::stopping;
      tick_.cancel();
      stop_job();
    } else if (state_ == State::backing_off) {
      backoff_timer_.cancel();
      after_stop();
    } else if (state_ == State::waiting_for_host) {
      host_wait_timer_.cancel();
      host_wait_->stop();
      after_stop();
    }
  }

  void succeed() { finish(0, "finished"); }

  void finish(int code, const std::string& outcome) {
    if (state_ == State::finished) return;
    state_ = State::finished;
    exit_code_ = code;
    report_held_refusals(Clock::now(), true);  // before the summary: the log ends with it
    double total = seconds(Clock::now() - started_);
    RunSummary::Totals totals = summary_.close(Clock::now());
    say(summary_.text(outcome, restart_, total, code));
    std::string causes = "[";
    for (const auto& c : totals.causes) causes += (causes.size() > 1 ? ", " : "") + json_string(c);
    causes += "]";
    events_->write("finish", {{"status", code == 0      ? "succeeded"
                                         : interrupted_ ? "interrupted"
                                         : code == 1    ? "gave_up"
                                                        : "error"},
                              {"exit_code", code},
                              {"restarts", restart_},
                              {"failures", static_cast<int>(summary_.failures())},
                              {"causes", Json::raw(causes)},
                              {"time_lost_s", totals.lost_s},
                              {"steps_redone", static_cast<unsigned long>(totals.steps_redone)},
                              {"total_s", total}});
    tick_.cancel();
    grace_timer_.cancel();
    backoff_timer_.cancel();
    host_wait_timer_.cancel();
    refusal_timer_.cancel();
    probe_->stop();
    host_wait_->stop();
    signals_.cancel();
    dump_signal_.cancel();
    if (dumps_) dumps_->cancel();
    io_.stop();
  }

  RunOptions options_;
  std::string run_id_;
  std::string token_;
  std::string mpirun_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::signal_set dump_signal_;  // SIGUSR1: collect_dumps
  asio::steady_timer tick_, grace_timer_, backoff_timer_, host_wait_timer_;
  // Refusals written out: 5 lines a second on stderr; in the events log 5 per peer
  // address and 20 in all per 10 s (a reader wants the first few of a kind, not each).
  asio::steady_timer refusal_timer_;
  RefusalLimiter refusal_lines_{std::chrono::seconds(1), 5, 5};
  RefusalLimiter refusal_events_{std::chrono::seconds(10), 20, 5};
  bool refusal_report_due_ = false;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<HeartbeatServer> server_;
  std::unique_ptr<HostPool> pool_;
  std::string address_;  // what ranks are told (TROUPE_SUPERVISOR)
  std::unique_ptr<Job> job_;
  LocalRanks local_{io_};        // this host's ranks, through pidfds
  bool said_unwatched_ = false;  // a rank of this launch was not watched, and we said why

  State state_ = State::running;
  int restart_ = 0;
  int interrupted_ = 0;  // the signal that asked us to stop
  int exit_code_ = 0;
  bool resumed_ = false;  // a step was reported in this launch
  Clock::time_point started_, launched_, stop_started_;
  std::optional<Clock::time_point> last_progress_;
  std::optional<std::uint64_t> furthest_step_;
  RunSummary summary_;
  StragglerWatch stragglers_;
  // --regrow: the probe of the hosts left out, the host that answered and the newest
  // checkpoint then (the job grows back after a newer one).
  std::unique_ptr<HostProbe> probe_;
  std::string regrow_host_;
  long long regrow_after_step_ = -1;
  bool regrowing_ = false;  // the job is being stopped to grow back
  int regrows_ = 0;         // relaunches that were regrowths, not failures
  int save_failures_ = 0;
  std::uint64_t save_failures_total_ = 0;  // for --metrics; save_failures_ restarts at each relaunch
  PhaseClock phases_;
  fs::file_time_type launched_file_time_{};  // crash dumps older than this launch are not its
  std::unique_ptr<DumpCollector> dumps_;     // with --checkpoint-dir: hang dumps (collect_dumps)
  std::unique_ptr<MetricsServer> metrics_;   // --metrics
  // --host-wait: the probe of a host a failed launch is blamed on, that host, whether
  // the last failure was a launch whose ranks never all registered, and the relaunches
  // after such a launch whose host had not answered (not counted as restarts).
  std::unique_ptr<HostProbe> host_wait_;
  std::string blamed_host_;
  long long launch_step_ = -1;  // the newest checkpoint when this launch began
  int failed_in_a_row_ = 0;     // launches that failed with no new checkpoint: the backoff's exponent
  bool launch_failed_ = false;
  int unreachable_launches_ = 0;  // checkpoint saves that ranks reported failed since the last relaunch
};

Supervisor::Supervisor(RunOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Supervisor::~Supervisor() = default;
int Supervisor::run() { return impl_->run(); }

}  // namespace troupe::supervisor
