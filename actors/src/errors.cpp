#include "troupe/actors/errors.hpp"

#include <cstdio>
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
    case ErrorCode::cancelled: return "cancelled";
    case ErrorCode::deadline_exceeded: return "deadline exceeded";
    case ErrorCode::actor_killed: return "actor killed";
    case ErrorCode::storage_failed: return "storage failed";
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

namespace {
std::string format_collective(const ErrorInfo& info, const std::vector<int>& failed) {
  std::string what = error_code_name(info.code);
  what += failed.size() == 1 ? " on rank " : " on ranks ";
  for (std::size_t i = 0; i < failed.size(); ++i) what += (i ? ", " : "") + std::to_string(failed[i]);
  what += " [";
  if (!info.actor.empty()) what += "actor " + info.actor + (info.method.empty() ? "" : ", ");
  what += info.method + "]: " + info.message;
  return what;
}
}  // namespace

CollectiveError::CollectiveError(ErrorInfo info, std::vector<int> failed_ranks)
    : RemoteError(info, format_collective(info, failed_ranks)), failed_(std::move(failed_ranks)) {}

bool print_error(std::string_view program, const std::exception& e, int rank) {
  if (dynamic_cast<const CollectiveError*>(&e) != nullptr && rank != 0) return false;
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(program.size()), program.data(), e.what());
  return true;
}

std::exception_ptr remote_error(ErrorInfo info) {
  switch (info.code) {
    case ErrorCode::actor_dead: return std::make_exception_ptr(ActorDead(std::move(info)));
    case ErrorCode::actor_restarted: return std::make_exception_ptr(ActorRestarted(std::move(info)));
    case ErrorCode::actor_killed: return std::make_exception_ptr(ActorKilled(std::move(info)));
    case ErrorCode::cancelled: return std::make_exception_ptr(Cancelled(std::move(info)));
    case ErrorCode::deadline_exceeded: return std::make_exception_ptr(DeadlineExceeded(std::move(info)));
    default: return std::make_exception_ptr(RemoteError(std::move(info)));
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
