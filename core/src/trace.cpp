#include "troupe/trace.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace troupe {

void Tracer::record(TraceSpan span) {
  if (!recording()) return;
  std::lock_guard lock(mutex_);
  if (spans_.size() >= max_spans_) {
    ++dropped_;
    return;
  }
  spans_.push_back(std::move(span));
}

void Tracer::name_this_thread(std::string name) {
  const std::uint32_t id = this_thread_id();
  std::lock_guard lock(mutex_);
  for (auto& [thread, named] : thread_names_)
    if (thread == id) {
      named = std::move(name);
      return;
    }
  thread_names_.emplace_back(id, std::move(name));
}

std::vector<TraceSpan> Tracer::take() {
  std::vector<TraceSpan> out;
  {
    std::lock_guard lock(mutex_);
    out.swap(spans_);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const TraceSpan& a, const TraceSpan& b) { return a.begin_ns < b.begin_ns; });
  return out;
}

std::vector<std::pair<std::uint32_t, std::string>> Tracer::thread_names() const {
  std::lock_guard lock(mutex_);
  return thread_names_;
}

std::uint64_t Tracer::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

std::int64_t Tracer::now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::uint32_t Tracer::this_thread_id() noexcept {
  thread_local const auto id = static_cast<std::uint32_t>(::syscall(SYS_gettid));
  return id;
}

TraceScope::TraceScope(Tracer* tracer, std::string_view category, std::string_view name) {
  if (tracer == nullptr || !tracer->recording()) return;
  tracer_ = tracer;
  category_ = category;
  name_ = name;
  begin_ns_ = Tracer::now_ns();
}

TraceScope::~TraceScope() {
  if (tracer_ == nullptr) return;
  tracer_->record(TraceSpan{.name = std::move(name_),
                            .category = std::move(category_),
                            .begin_ns = begin_ns_,
                            .end_ns = Tracer::now_ns(),
                            .thread = Tracer::this_thread_id(),
                            .track = {},
                            .args = std::move(args_)});
}

}  // namespace troupe
