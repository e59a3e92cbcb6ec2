// The actor call running on this thread, for this_call.hpp. Set by Runtime::execute
// around each call, and restored after: a method that waits may run other calls on
// its thread meanwhile.
#pragma once

#include "troupe/actors/detail/actor_cell.hpp"

namespace troupe::actors::detail {

struct CurrentCall {
  const Call* call = nullptr;
  const ActorCellBase* cell = nullptr;
  int rank = -1;
};

CurrentCall& current_call();

class CurrentCallScope {
 public:
  explicit CurrentCallScope(CurrentCall now) : previous_(current_call()) { current_call() = now; }
  ~CurrentCallScope() { current_call() = previous_; }
  CurrentCallScope(const CurrentCallScope&) = delete;
  CurrentCallScope& operator=(const CurrentCallScope&) = delete;

 private:
  CurrentCall previous_;
};

}  // namespace troupe::actors::detail
