// Errors that cross ranks. As in CAF, an error that travels is data -- a code, the
// rank and actor it happened at, the method, the exception's type and message -- and
// the caller's future rethrows it as one of the types below, so a `catch` can tell a
// method that threw from an actor that is gone.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::actors {

enum class ErrorCode : std::uint8_t {
  // The method threw; type and message are the exception's own.
  remote_exception = 1,
  // No actor with that id lives on that rank: never spawned there, or already stopped.
  unknown_actor = 2,
  // lookup() of a name that no live actor holds.
  unknown_name = 3,
  // The actor failed more often than its restart limit allows; it will not come back.
  actor_dead = 4,
  // The call was in flight when the actor was restarted and was not re-delivered.
  actor_restarted = 5,
  // The message did not deserialize (truncated, corrupt, or arguments of other types).
  bad_message = 6,
  // The method index is not in the actor type's method table.
  unknown_method = 8,
  // The runtime shut down before the answer came.
  shutdown = 9,
  // The rank hosting the actor stopped answering (its process died).
  rank_lost = 10,
  // spawn() of a type/constructor the receiving rank cannot build, or a taken name.
  spawn_failed = 11,
  // The actor is restarting and its queue is at the limit (SpawnOptions::max_queued),
  // or a call waited past SpawnOptions::queue_deadline for a restart to finish.
  overloaded = 12,
  // The asker cancelled the call (Future::cancel): before it ran, or while it ran and
  // the method gave up (this_call::throw_if_cancelled).
  cancelled = 13,
  // The call's deadline passed before it started (or before its answer came, at the
  // asker), or while it ran and the method gave up.
  deadline_exceeded = 14,
  // Runtime::kill stopped the actor; it will not come back.
  actor_killed = 15,
  // The object store could not read back a value it had spilled to disk (its file is
  // gone, unreadable or not what was written); retried before it is reported.
  storage_failed = 16,
};

const char* error_code_name(ErrorCode code);

// The travelling form of an error.
struct ErrorInfo {
  ErrorCode code = ErrorCode::remote_exception;
  std::int32_t rank = -1;
  std::string actor;
  std::string method;
  std::string type;
  std::string message;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(code, rank, actor, method, type, message);
  }
};

// Thrown by an actor method to say that the actor's state is broken. The runtime
// then re-creates the actor from its constructor arguments (if it was spawned with
// restarts left) instead of letting later calls see the broken state. Any other
// exception only fails the call that threw it.
class FatalError : public Error {
 public:
  using Error::Error;
};

// Raised at the caller for every error reported by another actor or rank.
class RemoteError : public Error {
 public:
  explicit RemoteError(ErrorInfo info);
  RemoteError(ErrorInfo info, const std::string& what) : Error(what), info_(std::move(info)) {}
  const ErrorInfo& info() const { return info_; }
  ErrorCode code() const { return info_.code; }
  int rank() const { return info_.rank; }
  const std::string& actor() const { return info_.actor; }
  const std::string& method() const { return info_.method; }
  // The original exception's type name, e.g. "std::invalid_argument".
  const std::string& type() const { return info_.type; }

 private:
  ErrorInfo info_;
};

class ActorDead : public RemoteError {
 public:
  using RemoteError::RemoteError;
};

class ActorRestarted : public RemoteError {
 public:
  using RemoteError::RemoteError;
};

// A dead actor that was stopped on purpose (Runtime::kill), not by its failures.
class ActorKilled : public ActorDead {
 public:
  using ActorDead::ActorDead;
};

class Cancelled : public RemoteError {
 public:
  using RemoteError::RemoteError;
};

class DeadlineExceeded : public RemoteError {
 public:
  using RemoteError::RemoteError;
};

// Thrown alike on every rank by a collective call that failed on some of them
// (spawn_on_each): the message names each failed rank and what it said, so the one
// copy rank 0 prints tells the whole story. rank() is -1: it is everyone's error.
class CollectiveError : public RemoteError {
 public:
  CollectiveError(ErrorInfo info, std::vector<int> failed_ranks);
  const std::vector<int>& failed_ranks() const { return failed_; }

 private:
  std::vector<int> failed_;
};

// Writes "program: error: <what>" to stderr -- unless `e` is a CollectiveError and
// `rank` is not 0, since every rank holds the same one. Returns whether it wrote.
bool print_error(std::string_view program, const std::exception& e, int rank);

// `info` as the most specific type for its code, for a future to rethrow. Made
// without a throw: unwinding cost a cancel's answer ~30 us of its ~140 at a rank
// whose caches had gone cold while its actor was busy.
std::exception_ptr remote_error(ErrorInfo info);

// Describes the exception in flight (inside a catch block) as ErrorInfo.
ErrorInfo describe_current_exception(std::int32_t rank, std::string actor, std::string method);

}  // namespace troupe::actors
