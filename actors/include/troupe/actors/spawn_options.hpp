// How an actor is spawned: its job-wide name and its supervision.
//
// Supervision follows Erlang's restart intensity: an actor whose method throws
// FatalError (or whose constructor throws during a restart) is re-created from its
// original constructor arguments, at most `max_restarts` times within `window`;
// one more failure inside the window and the actor is dead for good. After each
// re-creation the runtime calls `on_restart(int restart_count)` on the new object
// when the type has one -- the place to reload its last checkpoint.
//
// Calls that were already queued when the actor failed fail with ActorRestarted,
// except calls to methods the type lists as idempotent
//   static constexpr auto troupe_idempotent = troupe::methods<&T::get>;
// which are delivered to the new object in their original order. Calls that arrive
// while the actor restarts wait (at most `max_queued` of them, each at most
// `queue_deadline`), and are then handled by the new object.
//
// Back-pressure: with `mailbox_capacity` > 0, a call that finds that many calls of the
// actor waiting (or running) is refused at once with ErrorCode::overloaded: an ask's
// future fails, a tell is dropped and counted (Runtime::refused_tells(), a log line at
// the 1st, 2nd, 4th, 8th... refusal). Refusing rather than blocking the sender: a pool
// thread blocked on a full mailbox could be the one the slow actor needs (one pool
// thread by default), and the thread that receives from MPI must never block. A
// sender that must not lose work paces itself with asks (a window of them in flight).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace troupe::actors {

struct SpawnOptions {
  // A job-wide name for lookup(); empty for none. Names are unique across ranks.
  std::string name;
  // Re-creations allowed within `window`; 0 means a fatal error kills the actor.
  int max_restarts = 0;
  std::chrono::milliseconds window{60000};
  // Pause before each re-creation (a failing dependency gets time to come back).
  // The pause holds one pool thread of the actor's rank (waiting on a signal that
  // shutdown() gives, not sleeping).
  std::chrono::milliseconds backoff{0};
  // Bounds on the calls waiting while the actor restarts.
  std::size_t max_queued = 4096;
  std::chrono::milliseconds queue_deadline{30000};
  // Calls an actor may hold waiting before more are refused; 0: no bound.
  std::size_t mailbox_capacity = 0;

  template <class Archive>
  void serialize(Archive& ar) {
    auto window_ms = window.count(), backoff_ms = backoff.count(), deadline_ms = queue_deadline.count();
    ar(name, max_restarts, window_ms, backoff_ms, max_queued, deadline_ms, mailbox_capacity);
    window = std::chrono::milliseconds(window_ms);
    backoff = std::chrono::milliseconds(backoff_ms);
    queue_deadline = std::chrono::milliseconds(deadline_ms);
  }
};

}  // namespace troupe::actors
