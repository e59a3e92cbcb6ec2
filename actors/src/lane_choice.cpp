// Which lane of a concurrency group takes a call (scheduler.hpp, docs/ACTORS.md).
#include <chrono>
#include <memory>
#include <vector>

#include "scheduler.hpp"

namespace troupe::actors::detail {

namespace {
// Lane i of `cell` takes a call: counted before the caller posts it.
std::shared_ptr<Lane> take(const std::shared_ptr<ActorCellBase>& cell, std::uint32_t i) {
  Lane& lane = cell->lane(i);
  lane.count_posted();
  return std::shared_ptr<Lane>(cell, &lane);
}
}  // namespace

std::shared_ptr<Lane> Scheduler::lane_for(const std::shared_ptr<ActorCellBase>& cell, std::uint32_t method) {
  const LaneRange range = cell->lanes_of(method);
  if (range.count == 1) return std::shared_ptr<Lane>(cell, &cell->lane(range.first));  // ungrouped: not counted
  const std::int64_t budget = Clock::duration(kLaneQueueBudget).count();
  const std::int64_t run_limit = Clock::duration(kLaneRunLimit).count();
  std::int64_t now = 0;  // read only if a lane is running a call
  // The work queued on lane i: the calls ahead of a new one (the backlog counts a
  // running call), each taken to last as long as the lane's last call; -1 if the lane
  // has been running one call for longer than kLaneRunLimit.
  const auto work_on = [&](std::uint32_t i) -> std::int64_t {
    const Lane& lane = cell->lane(i);
    if (lane.running_method_.load(std::memory_order_relaxed) != Lane::kIdle) {
      if (now == 0) now = Clock::now().time_since_epoch().count();
      if (now - lane.running_since_ticks_.load(std::memory_order_relaxed) > run_limit) return -1;
    }
    return lane.backlog() * lane.last_call_ticks();
  };
  for (std::uint32_t i = range.first; i < range.first + range.count; ++i) {
    const std::int64_t work = work_on(i);
    if (work >= 0 && work < budget) return take(cell, i);
  }
  // None qualifies: the least work of the lanes not running a long call, scanned from
  // the next in turn, so that ties (a burst to a fresh group) go round robin. A lane
  // that has just answered its first call still counts it (taken once it is done,
  // after the reply), at a second, and must still win over a lane running long. The
  // turn counter is written only here: it is one atomic every sender would share.
  const std::uint32_t turn = cell->next_lane();
  std::uint32_t pick = range.first + turn % range.count;
  std::int64_t least = -1;
  for (std::uint32_t k = 0; k < range.count; ++k) {
    const std::uint32_t i = range.first + (turn + k) % range.count;
    const std::int64_t work = work_on(i);
    if (work >= 0 && (least < 0 || work < least)) {
      pick = i;
      least = work;
    }
  }
  return take(cell, pick);
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
