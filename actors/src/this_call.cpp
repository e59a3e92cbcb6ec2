#include "troupe/actors/this_call.hpp"

#include "current_call.hpp"
#include "troupe/actors/actor_ref.hpp"
#include "troupe/actors/errors.hpp"

namespace troupe::actors {

namespace detail {
CurrentCall& current_call() {
  thread_local CurrentCall now;
  return now;
}
}  // namespace detail

namespace this_call {

namespace {
bool past_deadline(const detail::Call& call) {
  return call.deadline_ticks() != 0 && Clock::now().time_since_epoch().count() > call.deadline_ticks();
}
}  // namespace

bool cancelled() {
  const detail::CurrentCall& now = detail::current_call();
  return now.call != nullptr && (now.call->cancel_requested() || past_deadline(*now.call));
}

void throw_if_cancelled() {
  const detail::CurrentCall& now = detail::current_call();
  if (now.call == nullptr) return;
  ErrorInfo info{ErrorCode::cancelled, now.rank, now.cell->label(), now.cell->method_name(now.call->method()), "", ""};
  if (now.call->cancel_requested()) {
    info.message = "the call was cancelled while it ran";
    throw Cancelled(std::move(info));
  }
  if (past_deadline(*now.call)) {
    info.code = ErrorCode::deadline_exceeded;
    info.message = "the call's deadline passed while it ran";
    throw DeadlineExceeded(std::move(info));
  }
}

std::optional<Clock::time_point> deadline() {
  const detail::CurrentCall& now = detail::current_call();
  if (now.call == nullptr || now.call->deadline_ticks() == 0) return std::nullopt;
  return Clock::time_point(Clock::duration(now.call->deadline_ticks()));
}

Runtime& runtime() {
  Runtime* runtime = detail::current_runtime();
  if (runtime == nullptr)
    TROUPE_THROW(InvalidArgument,
                 "this_call::runtime: called outside an actor call, a task or an actor's construction");
  return *runtime;
}

}  // namespace this_call
}  // namespace troupe::actors
