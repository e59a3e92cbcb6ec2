// Tracer: the spans of a window of steps, for a timeline (docs/OBSERVABILITY.md,
// "Timelines"). A program owns one per rank and hands a pointer to what it wants traced
// (communicators, the actors' runtime, the training loop); each records spans only
// while the tracer is recording, so a tracer that is off costs a pointer test and a
// relaxed load. chrome_trace.hpp turns the ranks' spans into one Chrome trace.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe {

struct TraceSpan {
  std::string name;
  std::string category;       // "step", "data", "compute", "collective", "wait", "checkpoint", "actor"
  std::int64_t begin_ns = 0;  // steady_clock, this process's
  std::int64_t end_ns = 0;
  std::uint32_t thread = 0;  // the OS thread that recorded it
  std::string track;         // a named row instead of the thread's (a communicator's collectives)
  std::string args;          // JSON object members, without braces: "\"bytes\":4096"
};

// A device's own clock (a GPU's stream), for spans of the work queued on it: a mark is
// an event queued beside the work, so its time is when the device got there, not when
// the host queued it. The CUDA one is the train module's (step_trace.cpp).
class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  virtual void* mark() = 0;
  // Nanoseconds from `from` to the later `to` on the device (waits for `to`).
  virtual std::int64_t between_ns(void* from, void* to) = 0;
  virtual void release(void* mark) = 0;
};

class Tracer {
 public:
  // Past `max_spans` a recording keeps nothing more and counts the drops.
  explicit Tracer(std::size_t max_spans = std::size_t{1} << 20) : max_spans_(max_spans) {}
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  ~Tracer();

  bool recording() const noexcept { return recording_.load(std::memory_order_relaxed); }
  // With a device clock, start() waits for the device once, to tie its clock to the
  // host's; every "compute" span then has a twin on the "GPU" row, timed on the device.
  void start();
  void stop() noexcept { recording_.store(false, std::memory_order_relaxed); }
  void set_device_clock(std::shared_ptr<DeviceClock> clock);
  DeviceClock* device_clock() const noexcept { return device_clock_.get(); }
  // A compute span's device marks (TraceScope): made into a span by take().
  void record_device(std::string name, void* begin, void* end, std::string args);

  // Keeps `span` if recording (any thread).
  void record(TraceSpan span);
  // The calling thread's row is called `name` in the trace ("training", "pool 2").
  void name_this_thread(std::string name);

  // Everything recorded so far, oldest first by begin (device spans timed now, which
  // waits for the device); the tracer is left empty.
  std::vector<TraceSpan> take();
  std::vector<std::pair<std::uint32_t, std::string>> thread_names() const;
  std::uint64_t dropped() const;

  static std::int64_t now_ns() noexcept;  // steady_clock
  static std::uint32_t this_thread_id() noexcept;

 private:
  struct DeviceSpan {
    std::string name, args;
    void* begin;
    void* end;
  };
  std::atomic<bool> recording_{false};
  std::size_t max_spans_;
  std::shared_ptr<DeviceClock> device_clock_;
  void* origin_mark_ = nullptr;  // queued at start(), reached at origin_ns_
  std::int64_t origin_ns_ = 0;
  std::vector<DeviceSpan> device_spans_;
  mutable std::mutex mutex_;
  std::vector<TraceSpan> spans_;
  std::vector<std::pair<std::uint32_t, std::string>> thread_names_;
  std::uint64_t dropped_ = 0;
};

// A span on the calling thread from construction to destruction. Nothing is recorded,
// and nothing allocated, when `tracer` is null or was not recording at construction.
class TraceScope {
 public:
  TraceScope(Tracer* tracer, std::string_view category, std::string_view name);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  bool active() const noexcept { return tracer_ != nullptr; }
  // JSON object members for the span ("\"micro_batch\":3"); only when active().
  void set_args(std::string args) { args_ = std::move(args); }

 private:
  Tracer* tracer_ = nullptr;
  std::int64_t begin_ns_ = 0;
  void* device_begin_ = nullptr;  // a compute span's mark on the tracer's device clock
  std::string category_;
  std::string name_;
  std::string args_;
};

}  // namespace troupe
