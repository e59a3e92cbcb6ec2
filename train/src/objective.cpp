#include "troupe/train/objective.hpp"

#include "troupe/error.hpp"

namespace troupe::train {

void Objective::add_metrics(const Tensor&, const Tensor&, std::int64_t, MetricSums&) const {}

double CrossEntropyObjective::forward(const Tensor& output, const Tensor& targets) {
  return loss_.forward(output, targets).item();
}

Tensor CrossEntropyObjective::backward(double scale) { return loss_.backward(scale); }

void CrossEntropyObjective::add_metrics(const Tensor& output, const Tensor& targets, std::int64_t samples,
                                        MetricSums& sums) const {
  sums["correct"] += nn::accuracy(output, targets, loss_.ignore_index()) * static_cast<double>(samples);
}

double MSEObjective::forward(const Tensor& output, const Tensor& targets) {
  return loss_.forward(output, targets).item();
}

Tensor MSEObjective::backward(double scale) { return loss_.backward(scale); }

double TensorParallelCrossEntropyObjective::forward(const Tensor& output, const Tensor& targets) {
  if (!loss_) {
    TROUPE_CHECK(output.defined() && output.dim() >= 1, "TensorParallelCrossEntropyObjective: logits must be [..., V]");
    std::int64_t vocab = output.size(-1);
    tp_->allreduce(collectives::Buffer(&vocab, 1));
    loss_ = std::make_unique<parallel::VocabParallelCrossEntropy>(*tp_, vocab);
  }
  return loss_->forward(output, targets).item();
}

Tensor TensorParallelCrossEntropyObjective::backward(double scale) {
  TROUPE_CHECK(loss_ != nullptr, "TensorParallelCrossEntropyObjective.backward: called before forward");
  return loss_->backward(scale);
}

}  // namespace troupe::train
