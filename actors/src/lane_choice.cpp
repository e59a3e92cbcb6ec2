// Which lane of a concurrency group takes a call (scheduler.hpp, docs/ACTORS.md).
#include <chrono>
#include <memory>
#include <vector>

#include "scheduler.hpp"

namespace troupe::actors::detail {

std::shared_ptr<Lane> Scheduler::lane_for(const std::shared_ptr<ActorCellBase>& cell, std::uint32_t method) {
  const LaneRange range = cell->lanes_of(method);
  if (range.count == 1) return std::shared_ptr<Lane>(cell, &cell->lane(range.first));
  const std::int64_t budget = Clock::duration(kLaneQueueBudget).count();
  const std::int64_t run_limit = Clock::duration(kLaneRunLimit).count();
  std::int64_t now = 0;  // read only if a lane is running a call
  std::uint32_t pick = range.first + range.count;
  for (std::uint32_t i = range.first; i < range.first + range.count; ++i) {
    const Lane& lane = cell->lane(i);
    const bool running = lane.running_method_.load(std::memory_order_relaxed) != Lane::kIdle;
    if (running) {
      if (now == 0) now = Clock::now().time_since_epoch().count();
      if (now - lane.running_since_ticks_.load(std::memory_order_relaxed) > run_limit) continue;
    }
    // The calls ahead of this one (the backlog counts a running call), each taken to
    // last as long as the lane's last call.
    const std::int64_t ahead = lane.backlog();
    if (ahead > 0 && ahead * lane.last_call_ticks() >= budget) continue;
    pick = i;
    break;
  }
  // No lane qualifies: round robin. Only here, as the counter is one atomic that every
  // sender to the actor would otherwise write.
  if (pick == range.first + range.count) pick = range.first + cell->next_lane() % range.count;
  Lane& lane = cell->lane(pick);
  lane.count_posted();
  return std::shared_ptr<Lane>(cell, &lane);
}

void Scheduler::redeal(std::shared_ptr<Lane> lane) {
  const std::shared_ptr<ActorCellBase> cell(lane, &lane->cell());
  std::vector<std::unique_ptr<Call>> calls;
  while (std::unique_ptr<Call> call = lane->mailbox().pop()) {
    lane->count_taken();
    calls.push_back(std::move(call));
  }
  // The lane is idle now, and may take some of them back: lane_for sees its long call.
  for (auto& call : calls) {
    const std::uint32_t method = call->method();
    post(lane_for(cell, method), std::move(call));
  }
}

}  // namespace troupe::actors::detail
