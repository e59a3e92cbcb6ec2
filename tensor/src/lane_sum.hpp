// lane_sum: the sum of f(i) over [0, n) as eight partial sums added in a fixed order.
//
// A single running sum is a chain of dependent adds that the vectoriser may not
// reorder (it would change the result); eight sums written out vectorise, and give
// the same bits however the loop is compiled (math_loops.cpp's SSE2 and AVX2 copies).
#pragma once

#include <cstdint>

namespace troupe::tensor::detail {

template <class Acc, class F>
inline Acc lane_sum(std::int64_t n, F f) {
  constexpr int kLanes = 8;
  Acc lanes[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += f(i + l);
  for (int l = 0; i < n; ++i, ++l) lanes[l] += f(i);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace troupe::tensor::detail
