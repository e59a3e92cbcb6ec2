// Running actor calls under supervision: stale calls after a restart, dead actors,
// fatal errors, and the restart itself (see spawn_options.hpp for the policy).
#include <cstdio>
#include <mutex>

#include "current_call.hpp"
#include "scheduler.hpp"
#include "troupe/actors/runtime.hpp"

namespace troupe::actors {

namespace {
using Clock = std::chrono::steady_clock;

ErrorInfo cell_error(ErrorCode code, int rank, const detail::ActorCellBase& cell, std::uint32_t method,
                     std::string message) {
  return {code, rank, cell.label(), cell.method_name(method), "", std::move(message)};
}

std::string dead_message(const detail::ActorCellBase& cell) {
  if (const int by = cell.killed_by_.load(); by >= 0)
    return detail::concat("the actor was stopped by Runtime::kill from rank ", by);
  return detail::concat("the actor failed more than ", cell.options().max_restarts, " time(s) within ",
                        cell.options().window.count(), " ms and was stopped for good");
}
// Marks the lane idle, and tells a replacer waiting for idle lanes.
void idle(detail::Lane& lane) {
  detail::ActorCellBase& cell = lane.cell();
  if (!cell.concurrent()) {  // nothing waits for it: no fence on the common path
    lane.running_method_.store(detail::Lane::kIdle, std::memory_order_relaxed);
    return;
  }
  lane.running_method_.store(detail::Lane::kIdle, std::memory_order_seq_cst);
  if (!cell.replacing_.load(std::memory_order_seq_cst)) return;
  { std::lock_guard lock(cell.gate_mutex_); }  // orders this against the replacer's check
  cell.gate_cv_.notify_all();
}

ErrorCode dead_code(const detail::ActorCellBase& cell) {
  return cell.killed_by_.load() >= 0 ? ErrorCode::actor_killed : ErrorCode::actor_dead;
}

// Whether `e`, thrown by the running call, is that call giving up on its own
// cancellation or deadline (and not, say, a Cancelled it got from an actor it asked).
bool gives_up(const RemoteError& e, const detail::Call& call) {
  if (e.code() == ErrorCode::cancelled) return call.cancel_requested();
  return e.code() == ErrorCode::deadline_exceeded && call.deadline_ticks() != 0 &&
         Clock::now().time_since_epoch().count() > call.deadline_ticks();
}
}  // namespace

void Runtime::post_call(const std::shared_ptr<detail::ActorCellBase>& cell, std::unique_ptr<detail::Call> call) {
  const std::uint32_t method = call->method();
  if (cell->dead()) return call->fail(cell_error(dead_code(*cell), rank_, *cell, method, dead_message(*cell)));
  if (cell->restarting() && static_cast<std::size_t>(cell->queued_.value()) >= cell->options().max_queued)
    return call->fail(cell_error(
        ErrorCode::overloaded, rank_, *cell, method,
        detail::concat("the actor is restarting and ", cell->queued_.value(), " calls already wait (max_queued)")));
  // The time posted only matters for a call re-delivered after a restart (its
  // queue_deadline); an actor that cannot restart is spared the clock read.
  const bool may_restart = cell->options().max_restarts > 0;
  call->stamp(cell->epoch(), may_restart ? Clock::now().time_since_epoch().count() : 0);
  // Counted in before the check, so that concurrent senders cannot overfill it.
  cell->queued_.add();
  if (const std::size_t capacity = cell->options().mailbox_capacity;
      capacity > 0 && static_cast<std::size_t>(cell->queued_.value()) > capacity) {
    cell->queued_.undo_add();
    return call->fail(
        cell_error(ErrorCode::overloaded, rank_, *cell, method,
                   detail::concat("the mailbox is full (", capacity, " calls wait: SpawnOptions::mailbox_capacity)")));
  }
  queued_calls_.add();
  if (call->request() != 0) cell->calls().add(*call);  // an ask: cancel() may look for it
  scheduler_->post(detail::Scheduler::lane_for(cell, method), std::move(call));
}

void Runtime::execute(detail::Lane& lane, std::unique_ptr<detail::Call> call) {
  detail::ActorCellBase& cell = lane.cell();
  detail::RuntimeScope scope(this);
  // Counted down when this call is over, however it ends, for shutdown's drain.
  struct Done {
    Runtime& runtime;
    ~Done() { runtime.call_finished(); }
  } done{*this};
  const std::uint32_t method = call->method();
  cell.queued_.remove();
  if (!call->claim_to_run()) return;  // cancelled before it started: the cancel answered the asker
  // What Runtime::actors() shows (this method, since the scheduler began the call) and,
  // for a concurrent actor, what a restart or kill waits for before it touches the object.
  struct Running {
    detail::Lane& lane;
    ~Running() {
      idle(lane);
      lane.cell().calls_served_.fetch_add(1, std::memory_order_relaxed);
    }
  } running{lane};
  if (cell.concurrent()) {
    // Dekker's handshake with replace_object(): each stores its own flag, then reads the
    // other's, so at least one of them sees the other and waits.
    for (;;) {
      lane.running_method_.store(method, std::memory_order_seq_cst);
      if (!cell.replacing_.load(std::memory_order_seq_cst)) break;
      idle(lane);
      std::unique_lock lock(cell.gate_mutex_);
      cell.gate_cv_.wait(lock, [&] { return !cell.replacing_.load(std::memory_order_seq_cst); });
    }
  } else {
    lane.running_method_.store(method, std::memory_order_relaxed);
  }
  if (cell.dead()) {
    call->fail(cell_error(dead_code(cell), rank_, cell, method, dead_message(cell)));
    return bury_if_killed(cell, lane);
  }
  if (call->epoch() < cell.epoch()) {
    // The call was queued when the actor failed.
    if (!cell.idempotent(method))
      return call->fail(cell_error(
          ErrorCode::actor_restarted, rank_, cell, method,
          detail::concat("the call was queued when the actor failed; it was restarted (restart ", cell.epoch(),
                         ") and the call was not re-delivered (its method is "
                         "not listed in troupe_idempotent)")));
    const auto waited = Clock::now() - Clock::time_point(Clock::duration(call->posted_ticks()));
    if (waited > cell.options().queue_deadline)
      return call->fail(cell_error(
          ErrorCode::overloaded, rank_, cell, method,
          detail::concat("the call waited ", std::chrono::duration_cast<std::chrono::milliseconds>(waited).count(),
                         " ms for the actor's restart (queue_deadline)")));
  }
  if (const std::int64_t deadline = call->deadline_ticks(); deadline != 0) {
    const std::int64_t now = Clock::now().time_since_epoch().count();
    if (now > deadline)
      return call->fail(cell_error(
          ErrorCode::deadline_exceeded, rank_, cell, method,
          detail::concat("the call's deadline passed ",
                         std::chrono::duration_cast<std::chrono::milliseconds>(Clock::duration(now - deadline)).count(),
                         " ms before it could start; it was not run")));
  }
  const int epoch = cell.epoch();  // the incarnation this call runs on
  detail::CurrentCallScope current({call.get(), &cell, rank_});
  std::shared_ptr<Tracer> tracer;
  if (tracing_.load(std::memory_order_relaxed)) {
    std::lock_guard lock(tracer_mutex_);
    tracer = tracer_;
  }
  const TraceScope span(tracer.get(), "actor",
                        tracer && tracer->recording() ? cell.label() + "." + cell.method_name(method) : std::string());
  try {
    call->run();
  } catch (const FatalError&) {
    ErrorInfo info = describe_current_exception(rank_, cell.label(), cell.method_name(method));
    // Another lane's call may have failed and restarted the actor meanwhile: once is enough.
    replace_object(cell, lane, [&] {
      if (cell.epoch() == epoch && !cell.dead()) restart_or_bury(cell);
    });
    info.code = cell.dead() ? dead_code(cell) : ErrorCode::actor_restarted;
    info.message += cell.dead() ? "; " + dead_message(cell)
                                : detail::concat("; the actor was restarted (restart ", cell.epoch(), ")");
    call->fail(info);
  } catch (const detail::BadMessage& e) {
    call->fail({ErrorCode::bad_message, rank_, cell.label(), cell.method_name(method), "BadMessage", e.what()});
  } catch (const RemoteError& e) {
    call->fail(gives_up(e, *call) ? e.info()
                                  : describe_current_exception(rank_, cell.label(), cell.method_name(method)));
  } catch (...) {
    call->fail(describe_current_exception(rank_, cell.label(), cell.method_name(method)));
  }
}

void Runtime::set_tracer(std::shared_ptr<Tracer> tracer) {
  std::lock_guard lock(tracer_mutex_);
  tracing_.store(tracer != nullptr, std::memory_order_relaxed);
  tracer_ = std::move(tracer);
}

void Runtime::replace_object(detail::ActorCellBase& cell, detail::Lane& own, const std::function<void()>& replace) {
  if (!cell.concurrent()) return replace();  // one lane: this call is the only one
  std::lock_guard lock(cell.replace_mutex_);
  cell.replacing_.store(true, std::memory_order_seq_cst);
  own.running_method_.store(detail::Lane::kIdle, std::memory_order_seq_cst);
  const auto all_idle = [&] {
    for (std::size_t i = 0; i < cell.lane_count(); ++i)
      if (cell.lane(i).running_method_.load(std::memory_order_seq_cst) != detail::Lane::kIdle) return false;
    return true;
  };
  {
    std::unique_lock gate(cell.gate_mutex_);
    cell.gate_cv_.wait(gate, all_idle);  // each lane that goes idle signals
  }
  const auto reopen = [&] {
    {
      std::lock_guard gate(cell.gate_mutex_);
      cell.replacing_.store(false, std::memory_order_seq_cst);
    }
    cell.gate_cv_.notify_all();
  };
  try {
    replace();
  } catch (...) {
    reopen();
    throw;
  }
  reopen();
}

void Runtime::restart_or_bury(detail::ActorCellBase& cell) {
  const SpawnOptions& options = cell.options();
  // Every call queued from now on belongs to the new incarnation; earlier ones are stale.
  cell.epoch_.fetch_add(1);
  cell.restarting_ = true;
  for (;;) {
    const auto now = Clock::now();
    cell.last_restart_ticks_ = now.time_since_epoch().count();
    cell.failures_.push_back(now);
    while (!cell.failures_.empty() && now - cell.failures_.front() > options.window) cell.failures_.pop_front();
    if (static_cast<int>(cell.failures_.size()) > options.max_restarts) {
      cell.dead_ = true;
      cell.restarting_ = false;
      cell.bury();
      std::fprintf(stderr, "troupe: rank %d: %s is dead: %s\n", rank_, cell.label().c_str(),
                   dead_message(cell).c_str());
      return;
    }
    if (options.backoff.count() > 0) {
      // The pause holds this thread (and the actor's mailbox, so that no call reaches
      // the failed object), but waits on a signal: shutdown() ends it at once.
      std::unique_lock lock(backoff_mutex_);
      backoff_cv_.wait_for(lock, options.backoff, [this] { return backoffs_ended_; });
    }
    try {
      detail::RuntimeScope scope(this);
      cell.rebuild(cell.epoch());
      cell.restarting_ = false;
      return;
    } catch (const std::exception& e) {
      // A constructor (or on_restart) that throws during a restart is one more failure.
      std::fprintf(stderr, "troupe: rank %d: restarting %s failed: %s\n", rank_, cell.label().c_str(), e.what());
    }
  }
}

}  // namespace troupe::actors
