// Objective: what a TrainWorker minimises and what it reports, given the model's
// output and the batch's targets. The recipe picks one (make_objective); the default
// is cross-entropy over class indices, which serves a classifier ([N, C] logits, [N]
// targets) and a language model ([B, T, V] logits, [B, T] next tokens) alike.
//
// forward() returns the batch's mean loss and keeps what backward() needs;
// backward(scale) is d(scale * loss)/d(output), the gradient that starts the model's
// backward. add_metrics() adds the batch's metric sums over samples (a sum, so that
// the driver can add up every rank's sums and divide by the samples once).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::train {

using tensor::Tensor;

// Metric name -> sum over samples ("correct": correctly classified samples).
using MetricSums = std::map<std::string, double>;

class Objective {
 public:
  virtual ~Objective() = default;
  virtual double forward(const Tensor& output, const Tensor& targets) = 0;
  virtual Tensor backward(double scale) = 0;
  // `samples` is the batch's size; the default reports nothing beyond the loss.
  virtual void add_metrics(const Tensor& output, const Tensor& targets, std::int64_t samples, MetricSums& sums) const;
};

// torch.nn.CrossEntropyLoss over the last dimension, with "correct" (argmax equals
// the target, counted per sample as the fraction of its non-ignored positions).
class CrossEntropyObjective final : public Objective {
 public:
  explicit CrossEntropyObjective(std::int64_t ignore_index = -100, double label_smoothing = 0.0)
      : loss_(ignore_index, label_smoothing) {}
  double forward(const Tensor& output, const Tensor& targets) override;
  Tensor backward(double scale) override;
  void add_metrics(const Tensor& output, const Tensor& targets, std::int64_t samples, MetricSums& sums) const override;

 private:
  nn::CrossEntropyLoss loss_;
};

// torch.nn.MSELoss (mean over elements), for regression; no metric beyond the loss.
class MSEObjective final : public Objective {
 public:
  double forward(const Tensor& output, const Tensor& targets) override;
  Tensor backward(double scale) override;

 private:
  nn::MSELoss loss_;
};

// Cross-entropy of a tensor-parallel model's logits, split by vocabulary over `tp`
// (parallel::VocabParallelCrossEntropy; the vocabulary is the sum of the ranks' widths,
// learnt at the first forward). The loss is the same on every tp rank; no "correct"
// metric (an argmax across ranks is not computed).
class TensorParallelCrossEntropyObjective final : public Objective {
 public:
  explicit TensorParallelCrossEntropyObjective(collectives::Communicator& tp) : tp_(&tp) {}
  double forward(const Tensor& output, const Tensor& targets) override;
  Tensor backward(double scale) override;

 private:
  collectives::Communicator* tp_;
  std::unique_ptr<parallel::VocabParallelCrossEntropy> loss_;
};

}  // namespace troupe::train
