// What both checkpoint benchmarks save (checkpoint_bench: one process; checkpoint_
// parallel_bench: several ranks), and the clock they use. bench/checkpoint_baselines.py
// builds the same sizes for h5py and torch.save.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

namespace troupe::bench {

using Clock = std::chrono::steady_clock;

// ~`total_mb` MB in 100 f32 tensors: a geometric spread from 4 KB up, scaled to the
// total, like the mix of biases, norms and big matrices of a real model.
inline std::vector<std::int64_t> tensor_sizes(double total_mb) {
  std::vector<double> w;
  for (int i = 0; i < 100; ++i) w.push_back(std::pow(1.08, i));
  double sum = 0;
  for (double x : w) sum += x;
  std::vector<std::int64_t> out;
  for (double x : w)
    out.push_back(std::max<std::int64_t>(1024, static_cast<std::int64_t>(x / sum * total_mb * 1e6 / 4)));
  return out;  // elements (f32)
}

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace troupe::bench
