// What a running actor method may ask about its own call: whether the asker cancelled
// it (Future::cancel, Runtime::kill) or its deadline passed. Cancellation is
// cooperative, as in Ray's and gRPC's models: a C++ thread cannot be stopped safely
// from outside, so a long method polls and gives up at a point of its choosing:
//
//   for (int step = 0; step < steps; ++step) {
//     troupe::this_call::throw_if_cancelled();  // the asker then gets Cancelled
//     ...
//   }
//
// Outside an actor call (or in a tell) there is nothing to cancel: cancelled() is false.
// runtime() is the Runtime running the call, for a task that keeps its result with
// `this_call::runtime().put(value)` and returns the ObjectRef.
#pragma once

#include <optional>

#include "troupe/actors/future.hpp"

namespace troupe::actors {
class Runtime;
}

namespace troupe::actors::this_call {

// True once the call was cancelled or its deadline has passed.
bool cancelled();
// Throws Cancelled or DeadlineExceeded (naming this rank, actor and method) when
// cancelled() is true; the runtime passes that error to the asker.
void throw_if_cancelled();
// The deadline the asker gave, if any.
std::optional<Clock::time_point> deadline();
// The runtime running this call (actor method, task or constructor); throws
// InvalidArgument on a thread that is not running one.
Runtime& runtime();

}  // namespace troupe::actors::this_call

namespace troupe {
namespace this_call = actors::this_call;
}
