// What the tensor- and pipeline-parallel tests share: token ids (tests/nn's), the
// distance between a gathered tensor and the one-rank reference, a data-parallel rank's
// step on half of a batch, and a pipeline's cross-entropy loss.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "../nn/token_ids.hpp"
#include "troupe/collectives/buffer.hpp"
#include "troupe/collectives/communicator.hpp"
#include "troupe/parallel/parallel_model.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::train::testing {

using nn::testing::token_ids;

// ||a - b|| / ||b|| over the whole tensor, in double.
inline double norm_relative(const tensor::Tensor& a, const tensor::Tensor& b) {
  const auto x = a.to_vector<float>(), y = b.to_vector<float>();
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    diff += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    ref += double(y[i]) * y[i];
  }
  return x.size() == y.size() ? std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30) : INFINITY;
}

// One step of `model` on this rank's half of step `step`'s batch (8 sequences of 16 of a
// 65-token vocabulary; dp has 2 ranks), clipped at `max_norm`: the mean loss over both
// halves, the whole batch's.
inline double train_half_batch(parallel::ParallelModel& model, const parallel::Loss& loss,
                               collectives::Communicator& dp, int step, double max_norm) {
  const std::int64_t half = 4, d = dp.rank();
  const tensor::Tensor x = token_ids(8, 16, 65, 100 + step), y = token_ids(8, 16, 65, 500 + step);
  double mean = model
                    .train_micro_batch(x.slice(d * half, (d + 1) * half), y.slice(d * half, (d + 1) * half), loss,
                                       {.accum_steps = 1, .steps_per_epoch = 1, .max_grad_norm = max_norm})
                    .loss;
  dp.allreduce(collectives::Buffer(&mean, 1), collectives::ReduceOp::avg);
  return mean;
}

// The last stage's loss for a Pipeline: `ce`'s mean over a micro-batch, and its gradient
// (nn::CrossEntropyLoss, or the vocabulary-parallel one under tensor parallelism).
template <class CrossEntropy>
parallel::PipelineLoss pipeline_loss(CrossEntropy& ce) {
  return {[&ce](const tensor::Tensor& out, const tensor::Tensor& y) { return ce.forward(out, y).item(); },
          [&ce](double scale) { return ce.backward(scale); }};
}

}  // namespace troupe::train::testing
