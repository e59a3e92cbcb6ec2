// Tasks: the function registry, the built-in runner actor, and placement.
#include <algorithm>
#include <map>
#include <stdexcept>

#include "peer_liveness.hpp"
#include "troupe/actors/runtime.hpp"

namespace troupe::actors {

namespace detail {

namespace {
struct TaskEntry {
  TaskInvoker invoke;
  std::string signature;
  std::string clash;  // another task's signature with the same key: both are refused
};
// Filled before main by TaskKey's static members, as the actor factories are.
std::map<std::uint64_t, TaskEntry>& task_registry() {
  static std::map<std::uint64_t, TaskEntry> registry;
  return registry;
}
}  // namespace

std::uint64_t register_task(const std::string& signature, TaskInvoker invoke) {
  std::uint64_t key = 1469598103934665603ULL;  // FNV-1a
  for (const unsigned char c : signature) key = (key ^ c) * 1099511628211ULL;
  // Before main nothing can be thrown to: a clash is kept and reported at each use.
  const auto [it, inserted] = task_registry().emplace(key, TaskEntry{invoke, signature, ""});
  if (!inserted && it->second.signature != signature) it->second.clash = signature;
  return key;
}

void check_task(std::uint64_t key) {
  const auto it = task_registry().find(key);
  if (it != task_registry().end() && !it->second.clash.empty())
    TROUPE_THROW(InvalidArgument, "the tasks ", task_name(it->second.signature), " and ", task_name(it->second.clash),
                 " have the same 64-bit key; rename one");
}

std::string task_name(std::string_view signature) {
  // GCC spells the parameter "[with auto F = square]" or "... = ns::square".
  const auto at = signature.find("F = ");
  if (at == std::string_view::npos) return std::string(signature);
  auto name = signature.substr(at + 4);
  if (!name.empty() && name.front() == '&') name.remove_prefix(1);
  name = name.substr(0, name.find_first_of(";]"));
  return unqualified(name);
}

std::string TaskRunner::run(std::uint64_t key, std::string args) {
  const auto& registry = task_registry();
  const auto it = registry.find(key);
  if (it == registry.end())
    throw std::invalid_argument("this rank's binary has no task with key " + std::to_string(key) +
                                " (is it the same binary?)");
  check_task(key);
  std::string result;
  it->second.invoke(args, result);
  return result;
}

}  // namespace detail

int Runtime::place_task(int requested) {
  std::lock_guard lock(tasks_mutex_);
  if (tasks_in_flight_.empty()) tasks_in_flight_.assign(static_cast<std::size_t>(size_), 0);
  int rank = requested;
  if (rank < 0) {  // the fewest in flight, ties in turn from where the last search stopped
    for (int k = 0; k < size_; ++k) {
      const int r = (next_task_rank_ + k) % size_;
      if (liveness_->lost(r)) continue;
      if (rank < 0 || tasks_in_flight_[static_cast<std::size_t>(r)] < tasks_in_flight_[static_cast<std::size_t>(rank)])
        rank = r;
    }
    TROUPE_CHECK(rank >= 0, "submit: every rank was lost; no rank can run the task");
    next_task_rank_ = (rank + 1) % size_;
  }
  ++tasks_in_flight_[static_cast<std::size_t>(rank)];
  return rank;
}

void Runtime::task_done(int rank) {
  std::lock_guard lock(tasks_mutex_);
  --tasks_in_flight_[static_cast<std::size_t>(rank)];
}

std::uint64_t Runtime::task_runner(int rank) {
  // Not tasks_mutex_: task_done, on the thread that receives answers, must never wait
  // for these spawns, whose answers that thread may have to receive.
  std::lock_guard lock(task_runners_mutex_);
  if (task_runners_.empty()) {
    // One runner on every rank, made at once on this rank's first task: a retry, which
    // runs on whatever thread saw the loss, then never waits for a spawn.
    task_runners_.assign(static_cast<std::size_t>(size_), 0);
    for (int r = 0; r < size_; ++r) {
      if (liveness_->lost(r)) continue;
      try {
        task_runners_[static_cast<std::size_t>(r)] = spawn<detail::TaskRunner>(r).id();
      } catch (const RemoteError& e) {
        if (e.code() != ErrorCode::rank_lost) throw;
      }
    }
  }
  const std::uint64_t id = task_runners_[static_cast<std::size_t>(rank)];
  if (id == 0)
    throw RemoteError({ErrorCode::rank_lost, rank, "tasks", "run", "", "the rank was lost before its first task"});
  return id;
}

}  // namespace troupe::actors
