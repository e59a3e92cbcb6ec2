// StepTrace: a TrainWorker's timeline of a window of steps (WorkerOptions::trace_dir
// and trace_steps, or troupe-run's --trace through TROUPE_TRACE_DIR and
// TROUPE_TRACE_STEPS). Every rank records its spans in a Tracer (troupe/trace.hpp)
// while the window's steps run; when the window closes, the ranks align their clocks
// with rank 0's and rank 0 writes DIR/trace.json, a Chrome trace that Perfetto and
// chrome://tracing open (docs/OBSERVABILITY.md, "Timelines").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "troupe/collectives/communicator.hpp"
#include "troupe/trace.hpp"

namespace troupe::train {

// Steps `first` to `last`, inclusive; step 1 is the first optimizer step of a run.
struct TraceWindow {
  std::int64_t first = 3, last = 5;
};
// "5-8" or "5"; anything else (or first > last, or a step < 1) is an InvalidArgument
// naming `what` (the flag or variable it came from).
TraceWindow parse_trace_window(std::string_view text, std::string_view what);

class StepTrace {
 public:
  // Collective over the world (it makes a communicator of its own, so the trace's
  // messages never shift the training communicators' sequence numbers).
  StepTrace(std::string dir, TraceWindow window, std::string program);
  ~StepTrace();

  Tracer* tracer() const { return tracer_.get(); }
  const std::shared_ptr<Tracer>& shared_tracer() const { return tracer_; }

  // The model trains on this rank's GPU: every compute span gets a twin timed by CUDA
  // events on the "GPU" row (what the device ran, not when the host queued it).
  void time_gpu();

  // Step `step` begins on this rank (the number the next optimizer step makes).
  void step_begins(std::int64_t step);
  // Step `step` has ended; after the window's last, the trace is written (every rank
  // calls this at the same step: it is collective then).
  void step_ends(std::int64_t step);
  // A training call ends: a window it cut short is written as far as it went
  // (collective when recording).
  void call_ends();

 private:
  void write();

  std::string dir_;
  TraceWindow window_;
  std::string program_;
  std::shared_ptr<Tracer> tracer_;
  std::unique_ptr<collectives::Communicator> comm_;
  std::int64_t step_begin_ns_ = 0;
  std::int64_t first_recorded_ = 0, last_recorded_ = 0;
  bool done_ = false;  // the window was written (or given up): once per worker
};

// A worker's trace: `dir` and `steps` (WorkerOptions::trace_dir and trace_steps), or
// else troupe-run's TROUPE_TRACE_DIR and TROUPE_TRACE_STEPS; null when neither names a
// folder. Collective when not null (every rank has the same options and environment).
std::unique_ptr<StepTrace> make_step_trace(const std::string& dir, const std::string& steps);

}  // namespace troupe::train
