// The backward that DistributedDataParallel and ShardedDataParallel share once their
// gradients are bound into buckets: the module's backward with the grad-ready hook
// armed (`in_backward`), the collectives already started awaited if it throws (their
// buffers must not change under MPI), and, when synchronising, `finish_sync` plus the
// step's SyncStats.
#pragma once

#include <chrono>
#include <vector>

#include "troupe/nn/module.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel::detail {

template <class Bucket, class FinishSync>
tensor::Tensor bucketed_backward(nn::Module& module, const tensor::Tensor& grad_output, bool& in_backward, bool sync,
                                 std::vector<Bucket>& buckets, SyncStats& stats, FinishSync finish_sync,
                                 std::chrono::steady_clock::time_point start) {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  in_backward = true;
  tensor::Tensor grad_input;
  try {
    grad_input = module.backward(grad_output);
  } catch (...) {
    in_backward = false;
    for (auto& bucket : buckets)
      if (bucket.launched) bucket.work.wait();
    throw;
  }
  in_backward = false;
  if (sync) {
    stats = SyncStats{};
    for (const auto& bucket : buckets) stats.buckets_launched_during_backward += bucket.launched ? 1 : 0;
    const auto compute_end = Clock::now();
    finish_sync();
    stats.wait_seconds = seconds_since(compute_end);
    stats.buckets = static_cast<int>(buckets.size());
    stats.backward_seconds = seconds_since(start);
  }
  return grad_input;
}

}  // namespace troupe::parallel::detail
