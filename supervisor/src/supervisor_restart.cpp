// Supervisor: a failure, stopping the job, the backoff, waiting for hosts, relaunch.
#include "supervisor_impl.hpp"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace troupe::supervisor {

void Supervisor::Impl::job_exited(int status) {
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

void Supervisor::Impl::fail(const std::string& cause, const std::string& given_detail, JsonFields fields, Blame blame) {
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

void Supervisor::Impl::stop_job() {
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
void Supervisor::Impl::kill_leftovers() {
  if (job_) job_->signal_group(SIGKILL);
  local_.signal(SIGKILL);
}

// Every rank of the job is gone: mpirun has nothing left to do but report, so it is
// killed and reaped now instead of being waited for.
void Supervisor::Impl::ranks_exited() {
  if (!job_) return;
  grace_timer_.cancel();
  job_->signal_group(SIGKILL);
  job_.reset();  // reaps mpirun (SIGKILL is immediate)
  events_->write("stopped", {{"restart", restart_},
                             {"teardown_s", seconds(Clock::now() - stop_started_)},
                             {"mpirun", "killed once every rank had exited"}});
  after_stop();
}

void Supervisor::Impl::after_stop() {
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
void Supervisor::Impl::wait_for_hosts(const std::string& blamed) {
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

void Supervisor::Impl::relaunch() {
  if (interrupted_) return finish(128 + interrupted_, "stopped by " + std::string(::strsignal(interrupted_)));
  const int before = pool_->np();
  if (restart_ - regrows_ - unreachable_launches_ >= options_.max_restarts)
    return finish(1, "gave up after " + std::to_string(restart_ - regrows_ - unreachable_launches_) + " restart(s)");
  if (save_failures_ > 0) {  // the job's saves failed: is the disk still full?
    const auto now = Clock::now();
    if (const std::string full = checkpoint_space_shortfall(options_.checkpoint_dir); !full.empty()) {
      if (!storage_wait_since_ && options_.storage_wait.count() > 0) {
        storage_wait_since_ = now;
        say(full + "; waiting up to " + decimal(options_.storage_wait.count()) + " s for room");
        events_->write("storage_wait", {{"restart", restart_}, {"reason", full}});
      }
      if (storage_wait_since_ && now - *storage_wait_since_ < options_.storage_wait) {
        state_ = State::backing_off;  // polled; SIGTERM cancels it as a backoff
        backoff_timer_.expires_after(std::chrono::milliseconds(250));
        backoff_timer_.async_wait([this](boost::system::error_code ec) {
          if (!ec && state_ == State::backing_off) relaunch();
        });
        return;
      }
      events_->write("storage_full", {{"restart", restart_}, {"reason", full}});
      return finish(1, "not relaunching: " + full +
                           "; free space and run troupe-run again (it resumes from the "
                           "newest checkpoint)");
    }
    if (storage_wait_since_)
      say("room in the checkpoint folder again after " + decimal(seconds(now - *storage_wait_since_)) + " s");
    storage_wait_since_.reset();
    save_failures_ = 0;
  }
  auto plan = pool_->plan_next_launch();
  for (const auto& host : plan.excluded_now) {
    say("leaving out host " + host + " after " + std::to_string(pool_->failures_of(host)) + " failure(s) blamed on it" +
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

}  // namespace troupe::supervisor
