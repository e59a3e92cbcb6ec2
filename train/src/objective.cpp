#include "troupe/train/objective.hpp"

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

}  // namespace troupe::train
