// Tracer: the spans of a window of steps, for a timeline (docs/OBSERVABILITY.md,
// "Timelines"). A program owns one per rank and hands a pointer to what it wants traced
// (communicators, the actors' runtime, the training loop); each records spans only
// while the tracer is recording, so a tracer that is off costs a pointer test and a
// relaxed load. chrome_trace.hpp turns the ranks' spans into one Chrome trace.
#pragma once

#include <atomic>
#include <cstdint>
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

class Tracer {
 public:
  // Past `max_spans` a recording keeps nothing more and counts the drops.
  explicit Tracer(std::size_t max_spans = std::size_t{1} << 20) : max_spans_(max_spans) {}
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  bool recording() const noexcept { return recording_.load(std::memory_order_relaxed); }
  void start() noexcept { recording_.store(true, std::memory_order_relaxed); }
  void stop() noexcept { recording_.store(false, std::memory_order_relaxed); }

  // Keeps `span` if recording (any thread).
  void record(TraceSpan span);
  // The calling thread's row is called `name` in the trace ("training", "pool 2").
  void name_this_thread(std::string name);

  // Everything recorded so far, oldest first by begin; the tracer is left empty.
  std::vector<TraceSpan> take();
  std::vector<std::pair<std::uint32_t, std::string>> thread_names() const;
  std::uint64_t dropped() const;

  static std::int64_t now_ns() noexcept;  // steady_clock
  static std::uint32_t this_thread_id() noexcept;

 private:
  std::atomic<bool> recording_{false};
  std::size_t max_spans_;
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
  std::string category_;
  std::string name_;
  std::string args_;
};

}  // namespace troupe
