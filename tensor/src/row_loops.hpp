// The row loops of LayerNorm and of a sum over rows, as templates: math_loops.cpp
// compiles their f32 forms for several instruction sets (always inlined: a call would
// land in the baseline copy); nn_ops.cpp and reduce.cpp use them for the other dtypes.
// Everything is summed in double, and every sum over a row is lane_sum's eight partial
// sums in a fixed order, so each compiled copy gives the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "lane_sum.hpp"
#include "troupe/tensor/dtype.hpp"

namespace troupe::tensor::detail {

// out[j] = the sum (or mean) over k < rows of in[k * inner + j], summed in double in
// acc[0..inner): a Linear's bias gradient.
template <class T>
[[gnu::always_inline]] inline void sum_rows_loop(const T* in, std::int64_t rows, std::int64_t inner, bool mean,
                                                 double* acc, T* out) {
  std::fill(acc, acc + inner, 0.0);
  for (std::int64_t k = 0; k < rows; ++k)
    for (std::int64_t j = 0; j < inner; ++j) acc[j] += static_cast<double>(in[k * inner + j]);
  for (std::int64_t j = 0; j < inner; ++j) out[j] = static_cast<T>(mean ? acc[j] / static_cast<double>(rows) : acc[j]);
}

// y = (x - mean) / std * w + b over each of `rows` rows of n (w and b both null: no
// affine), keeping each row's mean and 1/std.
template <class T>
[[gnu::always_inline]] inline void layer_norm_forward_rows(const T* xs, const T* w, const T* b, std::int64_t rows,
                                                           std::int64_t n, double eps, T* y, double* means,
                                                           double* rstds) {
  const double count = static_cast<double>(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = xs + r * n;
    T* yr = y + r * n;
    const double mean = lane_sum<double>(n, [&](std::int64_t i) { return static_cast<double>(xr[i]); }) / count;
    const double var = lane_sum<double>(n, [&](std::int64_t i) {  // two passes: no cancellation when |mean| >> std
      const double d = static_cast<double>(xr[i]) - mean;
      return d * d;
    });
    const double rstd = 1.0 / std::sqrt(var / count + eps);
    means[r] = mean;
    rstds[r] = rstd;
    for (std::int64_t i = 0; i < n; ++i) {
      double v = (static_cast<double>(xr[i]) - mean) * rstd;
      if (w) v = v * static_cast<double>(w[i]) + static_cast<double>(b[i]);
      yr[i] = T(static_cast<compute_t<T>>(v));
    }
  }
}

// The backward's weight and bias gradients ([n], added into over the rows; null
// without a weight) and its two [n] scratch rows.
struct LayerNormGrads {
  double *dweight, *dbias, *xhat, *dnorm;
};

template <class T>
[[gnu::always_inline]] inline void layer_norm_backward_rows(const T* xs, const T* gy, const T* w, const double* means,
                                                            const double* rstds, std::int64_t rows, std::int64_t n,
                                                            T* g_x, const LayerNormGrads& s) {
  const double count = static_cast<double>(n);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double mean = means[r], rstd = rstds[r];
    const T* xr = xs + r * n;
    const T* gyr = gy + r * n;
    for (std::int64_t i = 0; i < n; ++i) s.xhat[i] = (static_cast<double>(xr[i]) - mean) * rstd;
    if (w) {
      for (std::int64_t i = 0; i < n; ++i) {
        const double g = static_cast<double>(gyr[i]);
        s.dnorm[i] = g * static_cast<double>(w[i]);
        s.dweight[i] += g * s.xhat[i];
        s.dbias[i] += g;
      }
    } else {
      for (std::int64_t i = 0; i < n; ++i) s.dnorm[i] = static_cast<double>(gyr[i]);
    }
    const double mean_dnorm = lane_sum<double>(n, [&](std::int64_t i) { return s.dnorm[i]; }) / count;
    const double mean_dnorm_xhat = lane_sum<double>(n, [&](std::int64_t i) { return s.dnorm[i] * s.xhat[i]; }) / count;
    T* gxr = g_x + r * n;
    for (std::int64_t i = 0; i < n; ++i)
      gxr[i] = T(static_cast<compute_t<T>>(rstd * (s.dnorm[i] - mean_dnorm - s.xhat[i] * mean_dnorm_xhat)));
  }
}

}  // namespace troupe::tensor::detail
