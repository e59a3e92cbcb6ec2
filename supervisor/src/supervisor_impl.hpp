// Supervisor::Impl, troupe-run's restart loop (supervisor.hpp), for the three files
// that define it: supervisor.cpp (start, launch, finish, signals), supervisor_restart.cpp
// (a failure, stopping the job, the backoff, waiting for hosts, relaunch) and
// supervisor_watch.cpp (what the heartbeat server reports, the watchdog tick, hangs,
// dumps, stragglers, regrowth, refusals, metrics). Private to troupe-run.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

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
#include "supervisor.hpp"
#include "troupe/error.hpp"
#include "troupe/supervisor/rank_dump.hpp"
#include "troupe/supervisor/run_environment.hpp"

namespace troupe::supervisor {

namespace asio = boost::asio;
namespace fs = std::filesystem;

inline double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

inline std::string decimal(double v, int digits = 2) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, v);
  return buffer;
}

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
  explicit Impl(RunOptions options);
  int run();

  // ---- HeartbeatServer::Listener ----
  void on_rank_up(const RankStatus& rank) override;
  void on_rank_lost(const RankStatus& rank, const std::string& reason) override;

  // Every refusal is counted; only so many are written out (refusal_limiter.hpp), the
  // rest summed up once their window closes.
  void on_refusal(const Refusal& refusal) override;
  void on_notice(const RankStatus& rank, const Notice& notice) override;
  void on_progress(const RankStatus& rank) override;

 private:
  enum class State { running, stopping, waiting_for_host, backing_off, finished };

  void say(const std::string& line) { std::cerr << "troupe-run: " << line << std::endl; }

  // What --metrics serves, read at each scrape (job_metrics.hpp).
  JobMetrics job_metrics() const;

  // The summaries of refusal windows that are over (all of them with `force`).
  void report_held_refusals(Clock::time_point now, bool force = false);

  // A summary is due when a window that held refusals back closes, even if no refusal
  // follows to notice it.
  void schedule_refusal_report();
  static std::string at_step(const RankStatus& rank);
  void launch();

  // The watchdog: heartbeats and progress of every live rank, a few times per timeout.
  void schedule_tick();
  void check_ranks();

  // A slow rank is named, not restarted: the job is right, only slower (straggler_watch.hpp).
  void report_stragglers(Clock::time_point now);

  // ---- regrow: probe the hosts left out; take one back at the next checkpoint ----

  void host_back(const std::string& host);

  // The checkpoint the relaunch resumes from is on disk: stop and relaunch with the host.
  void regrow();

  // Five heartbeats per heartbeat timeout, and at most 0.1 s apart: progress is seen
  // when a heartbeat carries it, so this bounds how late a hang is reported and how
  // stale the step in a failure report is. A heartbeat costs a rank ~0.1 ms of CPU
  // here (bench/run supervisor), so 10 a second stay far below 1% of a core.
  Clock::duration heartbeat_interval() const;
  void report_hang(Clock::time_point now, Phase phase);

  // SIGUSR1: where is every rank now? The job goes on.
  void wait_for_dump_signal();

  // Asks every rank for its flight record and stacks (rank_dump.hpp), prints where each
  // rank is once they have written them (DumpCollector), and then calls `then` with a
  // note naming the folder ("" without --checkpoint-dir).
  void collect_dumps(const std::string& why, std::function<void(const std::string&)> then);
  void job_exited(int status);
  void fail(const std::string& cause, const std::string& given_detail, JsonFields fields, Blame blame = {});
  void stop_job();

  // SIGKILL to mpirun's group and to every rank of this host that registered: a rank
  // that left the group (some launchers setsid) must not outlive its job.
  void kill_leftovers();

  // Every rank of the job is gone: mpirun has nothing left to do but report, so it is
  // killed and reaped now instead of being waited for.
  void ranks_exited();
  void after_stop();

  // A launch failed before its ranks registered, blamed on `blamed`. If a host the
  // next launch needs does not answer (a node down, a link still cut) that launch has
  // no chance either: wait until every one answers, the blamed one first, up to
  // --host-wait, rather than spend restarts relaunching into one.
  void wait_for_hosts(const std::string& blamed);
  void relaunch();
  void interrupt(int signal);

  void succeed() { finish(0, "finished"); }

  void finish(int code, const std::string& outcome);
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
  // The errors this launch's ranks said they fail with (NoticeKind::error), by rank:
  // a lost rank's failure quotes its own.
  std::map<int, std::string> rank_errors_;

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
  int save_failures_ = 0;   // checkpoint saves that ranks reported failed since the last relaunch
  std::optional<Clock::time_point> storage_wait_since_;  // waiting for room in the checkpoint folder
  std::uint64_t save_failures_total_ = 0;                // for --metrics; save_failures_ restarts at each relaunch
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
  int unreachable_launches_ = 0;
};

}  // namespace troupe::supervisor
