// Status: what a training run tells the person watching it, from the primary rank only.
//
//  - A one-time summary at start (config, model with its parameter count, optimizer,
//    data set, world size): summary().
//  - Progress within an epoch: a bar with rate and ETA redrawn in place when stdout
//    is a terminal; when it is not (a log file, CI), a plain line at most every
//    `plain_interval_s` seconds instead, so logs stay readable.
//  - Metrics appended to a JSONL file, one object per log() call:
//      {"step": 120, "epoch": 3, "loss": 0.21, "test_accuracy": 0.96,
//       "samples_per_s": 41234.5, "wall_s": 2.75}
//    Appended, not truncated, so a resumed run continues the same file; the file is
//    flushed after every line, so a crash loses nothing that was logged.
//
// On every other rank, construct it with primary = false: every call is a no-op, so
// the training loop needs no `if (rank == 0)` around its reporting.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace troupe::train {

// Named values, in the order they should appear.
using Metrics = std::vector<std::pair<std::string, double>>;

struct StatusOptions {
  // JSONL metrics file, appended to; empty for none.
  std::string metrics_path;
  // Where progress and summaries go.
  std::FILE* out = stdout;
  // Draw a bar in place: -1 decides by isatty(out) (under mpirun, by the environment
  // variable TROUPE_PROGRESS=bar|plain, plain by default), 0 never, 1 always.
  int progress_bar = -1;
  // Without a bar, at most one progress line per this many seconds.
  double plain_interval_s = 10.0;
};

class Status {
 public:
  Status(bool primary, StatusOptions options = {});
  ~Status();
  Status(const Status&) = delete;
  Status& operator=(const Status&) = delete;

  bool active() const { return primary_; }
  bool drawing_bar() const { return bar_; }

  // "key: value" lines under a "== start ==" heading, printed once.
  void summary(const std::vector<std::pair<std::string, std::string>>& fields);
  // Starts the progress of one epoch of `steps` steps.
  void begin_epoch(std::int64_t epoch, std::int64_t epochs, std::int64_t steps);
  // `done` steps of the epoch are finished, `samples` samples seen in it so far.
  void progress(std::int64_t done, std::int64_t samples, const Metrics& metrics = {});
  // Ends the bar's line, if one is drawn (at the end of an epoch).
  void end_progress();
  // Ends the bar's line (if one is drawn) and prints `line`.
  void print(const std::string& line);
  // Appends one JSONL record. `samples_per_s` < 0 leaves it out.
  void log(std::int64_t step, std::int64_t epoch, const Metrics& metrics, double samples_per_s);

  // Seconds since this Status was made.
  double wall_seconds() const;

 private:
  bool primary_;
  StatusOptions options_;
  bool bar_ = false;
  bool bar_open_ = false;  // a bar line is drawn and not yet ended
  std::FILE* metrics_ = nullptr;
  std::chrono::steady_clock::time_point start_, epoch_start_;
  std::chrono::steady_clock::time_point last_plain_;  // last progress line or bar drawn
  std::int64_t epoch_ = 0, epochs_ = 0, steps_ = 0;
};

// A value for JSON: finite numbers as shortest round-trip text, others as null.
std::string json_number(double value);

}  // namespace troupe::train
