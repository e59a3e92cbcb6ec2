// Stopping work: cancelling one ask (Future::cancel, or its deadline passing at the
// asker) and killing an actor (Runtime::kill). See docs/ACTORS.md#cancellation-deadlines-and-kill.
#include <cstdio>

#include "scheduler.hpp"
#include "transport.hpp"
#include "troupe/actors/runtime.hpp"
#include "wire.hpp"

namespace troupe::actors {

void Runtime::cancel_call(const detail::CallHandle& call, detail::StateBase& state) {
  {
    std::lock_guard lock(pending_mutex_);
    if (shut_down_) return;  // every answer has come or failed
  }
  if (call.request == 0) return;  // the send failed at once; the future holds why
  if (call.rank == rank_) {
    auto cell = local_actor(call.actor);
    if (!cell) return;
    std::uint32_t method = 0;
    if (cell->calls().cancel(rank_, call.request, &method) == detail::CallRegistry::Found::claimed)
      state.set_error(
          std::make_exception_ptr(Cancelled({ErrorCode::cancelled, rank_, cell->label(), cell->method_name(method), "",
                                             "the call was cancelled before it started"})));
    return;
  }
  std::string message = new_message();
  detail::Header h;
  h.kind = detail::Kind::cancel;
  h.actor = call.actor;
  h.request = call.request;
  detail::write_header(message, h);
  try {
    transport_->send(call.rank, message);
  } catch (const std::exception& e) {  // the rank is gone: its loss fails the ask anyway
    std::fprintf(stderr, "troupe: rank %d: could not send a cancel to rank %d: %s\n", rank_, call.rank, e.what());
  }
}

void Runtime::handle_cancel(int source, std::uint64_t actor, std::uint64_t request) {
  auto cell = local_actor(actor);
  if (!cell) return;  // the actor is gone; its asks failed already
  std::uint32_t method = 0;
  if (cell->calls().cancel(source, request, &method) != detail::CallRegistry::Found::claimed) return;
  reply_error(source, request,
              {ErrorCode::cancelled, rank_, cell->label(), cell->method_name(method), "",
               "the call was cancelled before it started"});
}

Future<void> Runtime::kill_actor(int rank, std::uint64_t id, const std::string& type) {
  const std::string what = detail::concat("kill ", type, " #", id, " on rank ", rank);
  TROUPE_CHECK(rank >= 0 && rank < size_, what, ": rank ", rank, " is outside the world of ", size_, " ranks");
  if (rank == rank_) {
    auto state = std::make_shared<detail::State<void>>(transport_.get(), what);
    try {
      kill_local(id, rank_);
      state->set_value();
    } catch (...) {
      state->set_error(std::current_exception());
    }
    return Future<void>(state);
  }
  auto acknowledged = std::make_shared<detail::State<bool>>(transport_.get(), what);
  detail::Header h;
  h.kind = detail::Kind::kill;
  h.actor = id;
  send_with_reply(rank, h, new_message(), std::make_shared<detail::TypedReply<bool>>(what, acknowledged));
  return Future<bool>(acknowledged).then([](bool) {});
}

void Runtime::kill_local(std::uint64_t id, int by) {
  auto cell = local_actor(id);
  if (!cell)
    throw RemoteError({ErrorCode::unknown_actor, rank_, "#" + std::to_string(id), "kill", "",
                       "no such actor on this rank (never spawned, or stopped)"});
  int none = -1;
  if (cell->dead() || !cell->killed_by_.compare_exchange_strong(none, by)) return;
  cell->dead_ = true;  // from here on, calls fail as they are posted or popped
  cell->calls().cancel_running();
  // The object is destroyed on the thread that owns the actor, after the call running
  // now: this call (or any queued before it, which now fail) buries it.
  cell->queued_.add();
  queued_calls_.add();
  scheduler_->post(std::shared_ptr<detail::Lane>(cell, &cell->lane(0)),
                   detail::make_call(
                       detail::ActorCellBase::kIdle, [] {}, [](const ErrorInfo&) {}));
}

void Runtime::bury_if_killed(detail::ActorCellBase& cell, detail::Lane& own) {
  if (cell.killed_by_.load() < 0 || cell.buried_.exchange(true)) return;
  replace_object(cell, own, [&] {
    try {
      cell.bury();
    } catch (const std::exception& e) {  // a destructor that throws has no one to tell but stderr
      std::fprintf(stderr, "troupe: rank %d: destroying the killed %s threw: %s\n", rank_, cell.label().c_str(),
                   e.what());
    }
  });
}

}  // namespace troupe::actors
