// WeightGradients: the weight-gradient products a backward put off, run later.
//
// A zero-bubble pipeline (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024)
// splits a stage's backward in two: the gradient with respect to its input (B), which
// the previous stage waits for, and its weights' gradients (W), which nothing waits for
// until the optimizer step, so W can fill the time the stage would spend waiting.
// Installed on a module tree (Module::defer_weight_gradients), a queue takes each
// Linear's dW += gy^T x instead of computing it: that backward returns once dx and the
// bias's gradient are made. run() computes the products later, oldest first, and marks
// each weight ready then (the grad-ready hook fires at that moment, not in backward).
//
// The products are the same ones, added in the same order per weight, so the gradients
// are bit for bit an undeferred backward's, unless another layer adds into the same
// gradient meanwhile (a tied weight used by a deferring Linear and by an Embedding of
// the same tree: their sum is taken in the other order). A queued product keeps its
// layer's input and output gradient alive until it runs, and reads them then: so a
// backward must not write into a gradient it gave a child's backward (GPT's Block adds
// its residual's out of place).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

namespace troupe::nn {

class WeightGradients {
 public:
  WeightGradients() = default;
  WeightGradients(WeightGradients&&) = default;
  WeightGradients& operator=(WeightGradients&&) = default;
  WeightGradients(const WeightGradients&) = delete;
  WeightGradients& operator=(const WeightGradients&) = delete;

  // A layer's backward queues its weight's product here.
  void defer(std::function<void()> product) { products_.push_back(std::move(product)); }
  // Computes every queued product, oldest first; the queue is empty after, even when
  // one throws (the rest are dropped with it).
  void run();
  bool empty() const { return products_.empty(); }
  std::size_t size() const { return products_.size(); }

 private:
  std::vector<std::function<void()>> products_;
};

}  // namespace troupe::nn
