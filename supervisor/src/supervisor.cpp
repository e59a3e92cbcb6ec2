// Supervisor: starting the run, launching mpirun, signals and the end of the run.
// The restart loop's other parts are in supervisor_restart.cpp and supervisor_watch.cpp.
#include "supervisor_impl.hpp"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <thread>

namespace troupe::supervisor {

Supervisor::Impl::Impl(RunOptions options)
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
      TROUPE_THROW(Error, "troupe-run: cannot create --checkpoint-dir '", options_.checkpoint_dir, "': ", ec.message());
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

int Supervisor::Impl::run() {
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

void Supervisor::Impl::launch() {
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
  rank_errors_.clear();
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

void Supervisor::Impl::interrupt(int signal) {
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

void Supervisor::Impl::finish(int code, const std::string& outcome) {
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

Supervisor::Supervisor(RunOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Supervisor::~Supervisor() = default;
int Supervisor::run() { return impl_->run(); }

}  // namespace troupe::supervisor
