#include "troupe/trace.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace troupe {

void Tracer::start() {
  if (device_clock_ && origin_mark_ == nullptr) {
    origin_mark_ = device_clock_->mark();
    device_clock_->between_ns(origin_mark_, origin_mark_);  // waits until the device is there
    origin_ns_ = now_ns();
  }
  recording_.store(true, std::memory_order_relaxed);
}

void Tracer::set_device_clock(std::shared_ptr<DeviceClock> clock) { device_clock_ = std::move(clock); }

Tracer::~Tracer() {
  if (!device_clock_) return;
  for (DeviceSpan& span : device_spans_) {
    device_clock_->release(span.begin);
    device_clock_->release(span.end);
  }
  if (origin_mark_ != nullptr) device_clock_->release(origin_mark_);
}

void Tracer::record_device(std::string name, void* begin, void* end, std::string args) {
  std::lock_guard lock(mutex_);
  if (!recording() || spans_.size() + device_spans_.size() >= max_spans_) {
    if (recording()) ++dropped_;
    device_clock_->release(begin);
    device_clock_->release(end);
    return;
  }
  device_spans_.push_back({std::move(name), std::move(args), begin, end});
}

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
  std::vector<DeviceSpan> device;
  {
    std::lock_guard lock(mutex_);
    out.swap(spans_);
    device.swap(device_spans_);
  }
  for (DeviceSpan& span : device) {
    out.push_back(TraceSpan{.name = std::move(span.name),
                            .category = "gpu",
                            .begin_ns = origin_ns_ + device_clock_->between_ns(origin_mark_, span.begin),
                            .end_ns = origin_ns_ + device_clock_->between_ns(origin_mark_, span.end),
                            .thread = 0,
                            .track = "GPU",
                            .args = std::move(span.args)});
    device_clock_->release(span.begin);
    device_clock_->release(span.end);
  }
  if (origin_mark_ != nullptr && !recording()) {
    device_clock_->release(origin_mark_);
    origin_mark_ = nullptr;
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
  if (category == "compute" && tracer->device_clock() != nullptr) device_begin_ = tracer->device_clock()->mark();
  begin_ns_ = Tracer::now_ns();
}

TraceScope::~TraceScope() {
  if (tracer_ == nullptr) return;
  if (device_begin_ != nullptr) tracer_->record_device(name_, device_begin_, tracer_->device_clock()->mark(), args_);
  tracer_->record(TraceSpan{.name = std::move(name_),
                            .category = std::move(category_),
                            .begin_ns = begin_ns_,
                            .end_ns = Tracer::now_ns(),
                            .thread = Tracer::this_thread_id(),
                            .track = {},
                            .args = std::move(args_)});
}

}  // namespace troupe
