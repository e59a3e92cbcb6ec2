// The live view of a job's actors: Runtime::actors() asks every rank for its list,
// and with TROUPE_STATUS_DIR set each rank writes its own list there about once a
// second, which `troupe-run status DIR` reads while the job runs.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "transport.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/json_string.hpp"
#include "wire.hpp"

namespace troupe::actors {

namespace {

constexpr std::chrono::milliseconds kStatusPeriod{1000};

const char* state_of(const detail::ActorCellBase& cell) {
  if (cell.killed_by_.load() >= 0) return "killed";
  if (cell.dead()) return "dead";
  if (cell.restarting()) return "restarting";
  return "alive";
}

}  // namespace

std::vector<ActorInfo> Runtime::local_actors() const {
  std::vector<std::shared_ptr<detail::ActorCellBase>> cells;
  {
    std::shared_lock lock(actors_mutex_);
    for (const auto& [id, cell] : actors_) cells.push_back(cell);
  }
  std::sort(cells.begin(), cells.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  const std::int64_t now = Clock::now().time_since_epoch().count();
  std::vector<ActorInfo> out;
  out.reserve(cells.size());
  for (const auto& cell : cells) {
    ActorInfo info;
    info.rank = rank_;
    info.id = cell->id();
    info.type = cell->type_label();
    info.name = cell->name();
    info.label = cell->label();
    info.state = state_of(*cell);
    info.mailbox_depth = static_cast<std::uint64_t>(cell->queued_.value());
    info.calls_served = cell->calls_served_.load(std::memory_order_relaxed);
    info.restarts = cell->epoch();
    for (std::size_t i = 0; i < cell->lane_count(); ++i) {  // each lane runs one call at most
      const detail::Lane& lane = cell->lane(i);
      const std::uint32_t method = lane.running_method_.load(std::memory_order_relaxed);
      if (method == detail::Lane::kIdle) continue;
      info.running += (info.running.empty() ? "" : ", ") + cell->method_name(method);
      const std::int64_t since = lane.running_since_ticks_.load(std::memory_order_relaxed);
      info.running_for_s =
          std::max(info.running_for_s,
                   std::chrono::duration<double>(Clock::duration(std::max<std::int64_t>(0, now - since))).count());
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<ActorInfo> Runtime::actors() {
  using List = std::vector<ActorInfo>;
  std::vector<std::shared_ptr<detail::State<List>>> answers(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {  // all asked at once: one round trip, not size_ of them
    if (r == rank_) continue;
    const std::string what = "list the actors of rank " + std::to_string(r);
    auto& state = answers[static_cast<std::size_t>(r)];
    state = std::make_shared<detail::State<List>>(transport_.get(), what);
    detail::Header h;
    h.kind = detail::Kind::list_actors;
    send_with_reply(r, h, new_message(), std::make_shared<detail::TypedReply<List>>(what, state));
  }
  List all;
  for (int r = 0; r < size_; ++r) {
    List some;
    if (r == rank_) {
      some = local_actors();
    } else {
      try {
        some = Future<List>(answers[static_cast<std::size_t>(r)]).get();
      } catch (const RemoteError& e) {
        if (e.code() != ErrorCode::rank_lost) throw;
      }
    }
    std::move(some.begin(), some.end(), std::back_inserter(all));
  }
  return all;
}

void Runtime::write_status(bool finished) const {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string text = "{\"rank\": " + std::to_string(rank_) + ", \"size\": " + std::to_string(size_) +
                     ", \"host\": " + json_string(host) + ", \"pid\": " + std::to_string(::getpid()) +
                     ", \"time\": " + std::to_string(std::time(nullptr)) +
                     ", \"finished\": " + (finished ? "true" : "false") + ", \"actors\": [";
  bool first = true;
  for (const ActorInfo& a : local_actors()) {
    text += first ? "\n  " : ",\n  ";
    first = false;
    char running_for[32];
    std::snprintf(running_for, sizeof running_for, "%.3f", a.running_for_s);
    text += "{\"id\": " + std::to_string(a.id) + ", \"type\": " + json_string(a.type) +
            ", \"name\": " + json_string(a.name) + ", \"label\": " + json_string(a.label) +
            ", \"state\": " + json_string(a.state) + ", \"mailbox_depth\": " + std::to_string(a.mailbox_depth) +
            ", \"running\": " + json_string(a.running) + ", \"running_for_s\": " + running_for +
            ", \"calls_served\": " + std::to_string(a.calls_served) + ", \"restarts\": " + std::to_string(a.restarts) +
            "}";
  }
  text += "]}\n";
  // Written aside and renamed: a reader sees the last whole snapshot, never half of one.
  const std::filesystem::path path = std::filesystem::path(status_dir_) / ("rank-" + std::to_string(rank_) + ".json");
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    if (!out) return;  // a full or vanished disk costs the view, never the job
  }
  std::error_code ignored;
  std::filesystem::rename(temporary, path, ignored);
}

void Runtime::start_status_writer() {
  const char* dir = std::getenv("TROUPE_STATUS_DIR");
  if (dir == nullptr || *dir == '\0') return;
  status_dir_ = dir;
  std::error_code error;
  std::filesystem::create_directories(status_dir_, error);
  if (error) {
    std::fprintf(stderr, "troupe: rank %d: TROUPE_STATUS_DIR '%s' cannot be created (%s); no status files\n", rank_,
                 dir, error.message().c_str());
    status_dir_.clear();
    return;
  }
  status_thread_ = std::thread([this] {
    std::unique_lock lock(status_mutex_);
    while (!status_stop_) {
      lock.unlock();
      write_status(false);
      lock.lock();
      status_cv_.wait_for(lock, kStatusPeriod, [this] { return status_stop_; });
    }
  });
}

void Runtime::stop_status_writer() {
  if (!status_thread_.joinable()) return;
  {
    std::lock_guard lock(status_mutex_);
    status_stop_ = true;
  }
  status_cv_.notify_all();
  status_thread_.join();
  write_status(true);
}

}  // namespace troupe::actors
