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
#pragma once

#include <optional>

#include "troupe/actors/future.hpp"

namespace troupe::actors::this_call {

// True once the call was cancelled or its deadline has passed.
bool cancelled();
// Throws Cancelled or DeadlineExceeded (naming this rank, actor and method) when
// cancelled() is true; the runtime passes that error to the asker.
void throw_if_cancelled();
// The deadline the asker gave, if any.
std::optional<Clock::time_point> deadline();

}  // namespace troupe::actors::this_call

namespace troupe {
namespace this_call = actors::this_call;
}
