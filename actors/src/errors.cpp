#include "troupe/actors/errors.hpp"

#include <typeinfo>

#include "troupe/actors/methods.hpp"

namespace troupe::actors {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::remote_exception: return "remote exception";
    case ErrorCode::unknown_actor: return "unknown actor";
    case ErrorCode::unknown_name: return "unknown name";
    case ErrorCode::actor_dead: return "actor dead";
    case ErrorCode::actor_restarted: return "actor restarted";
    case ErrorCode::bad_message: return "bad message";
    case ErrorCode::unknown_method: return "unknown method";
    case ErrorCode::shutdown: return "shutdown";
    case ErrorCode::rank_lost: return "rank lost";
    case ErrorCode::spawn_failed: return "spawn failed";
    case ErrorCode::overloaded: return "overloaded";
  }
  return "unknown error code";
}

namespace {
std::string format(const ErrorInfo& info) {
  std::string where = "[rank " + std::to_string(info.rank);
  if (!info.actor.empty()) where += ", actor " + info.actor;
  if (!info.method.empty()) where += ", " + info.method;
  where += "]";
  std::string what = error_code_name(info.code);
  if (!info.type.empty()) what += " " + info.type;
  return what + ": " + info.message + " " + where;
}
}  // namespace

RemoteError::RemoteError(ErrorInfo info) : Error(format(info)), info_(std::move(info)) {}

void throw_remote(ErrorInfo info) {
  switch (info.code) {
    case ErrorCode::actor_dead: throw ActorDead(std::move(info));
    case ErrorCode::actor_restarted: throw ActorRestarted(std::move(info));
    default: throw RemoteError(std::move(info));
  }
}

ErrorInfo describe_current_exception(std::int32_t rank, std::string actor, std::string method) {
  ErrorInfo info{ErrorCode::remote_exception, rank, std::move(actor), std::move(method), "", ""};
  try {
    throw;
  } catch (const std::exception& e) {
    info.type = detail::demangle(typeid(e).name());
    info.message = e.what();
  } catch (...) {
    info.type = "unknown";
    info.message = "a non-std::exception was thrown";
  }
  return info;
}

}  // namespace troupe::actors
