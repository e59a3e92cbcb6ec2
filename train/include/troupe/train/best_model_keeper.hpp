// BestModelKeeper: remembers the model state with the best value of one metric
// ("test_accuracy" max, "val_loss" min), so the run can end with its best model
// rather than its last one.
//
// update() compares the metric with the best so far (strictly better wins, so the
// earliest of equal values is kept); on improvement it keeps a deep copy of the state
// and, when a path was given, writes it to that file: to `<path>.tmp`, fsync'd, then
// renamed, so the file is always a whole model. The file format (until the checkpoint
// module takes this over) is a cereal binary archive: magic "troupe-best-model",
// version 1, metric name, mode, value, step, then (name, tensor) pairs.
// load_file() checks all of it and throws FormatError naming the file otherwise.
//
// Only the primary rank should hold one with a path; the parameters are identical on
// every rank anyway. state_dict() holds the metric, mode, best value and step (the
// checkpoint's /best group), not the model copy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "troupe/nn/state_dict.hpp"
#include "troupe/train/status.hpp"

namespace troupe::train {

struct BestModelFile {
  std::string metric;
  std::string mode;
  double value = 0;
  std::int64_t step = 0;
  nn::StateDict state;
};

class BestModelKeeper {
 public:
  // `mode` is "min" or "max"; anything else is an InvalidArgument. An empty `path`
  // keeps the best state in memory only.
  BestModelKeeper(std::string metric, std::string mode, std::string path = "");

  // True if `metrics` holds a better value of the metric than any before (a metric
  // missing from `metrics` is an InvalidArgument naming the ones present; a NaN
  // never improves).
  bool update(const Metrics& metrics, const nn::StateDict& state, std::int64_t step);

  const std::string& metric() const { return metric_; }
  bool has_best() const { return best_.has_value(); }
  // The best value and its step; InvalidArgument before the first update().
  double best_value() const;
  std::int64_t best_step() const { return best_step_; }
  const nn::StateDict& best_state() const { return best_state_; }

  nn::StateDict state_dict() const;
  void load_state_dict(const nn::StateDict& dict);

  static BestModelFile load_file(const std::string& path);

 private:
  void write_file() const;

  std::string metric_;
  bool maximise_;
  std::string path_;
  std::optional<double> best_;
  std::int64_t best_step_ = -1;
  nn::StateDict best_state_;
};

}  // namespace troupe::train
