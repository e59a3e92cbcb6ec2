// Reductions over a whole tensor or along one dimension.
//
// Along a dimension the tensor is seen as [outer, n, inner]; the loop walks n in
// the middle and keeps `inner` running accumulators, so memory is read in order
// whatever the dimension. Floating values accumulate in double: a training loss or
// a gradient norm over millions of f32 elements keeps its digits. On CUDA
// (cuda_backend.cu) f16/bf16 accumulate in f32 and f32/f64 in double.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "convert.hpp"
#include "cuda/cuda_backend.hpp"
#include "math_loops.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::tensor {

namespace {

using detail::convert;
using detail::load;

enum class Reduction { sum, mean, max, min, norm, argmax };

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::sum: return "sum";
    case Reduction::mean: return "mean";
    case Reduction::max: return "max";
    case Reduction::min: return "min";
    case Reduction::norm: return "norm";
    case Reduction::argmax: return "argmax";
  }
  return "reduce";
}

cuda_backend::ReduceOp cuda_reduction(Reduction r) {
  using R = cuda_backend::ReduceOp;
  switch (r) {
    case Reduction::sum: return R::sum;
    case Reduction::mean: return R::mean;
    case Reduction::max: return R::max;
    case Reduction::min: return R::min;
    case Reduction::norm: return R::norm;
    case Reduction::argmax: return R::argmax;
  }
  return R::sum;
}

DType result_dtype(Reduction r, DType in) {
  if (r == Reduction::argmax) return DType::i64;
  if (r == Reduction::sum && !is_floating(in)) return DType::i64;
  return in;
}

// Accumulates one output element. Floating values in double, integers in i64.
template <class T>
struct Accumulator {
  using Acc = std::conditional_t<std::is_integral_v<T>, std::int64_t, double>;
  Acc value{};
  std::int64_t best_index = -1;
  bool is_nan = false;

  void add(Reduction r, T x, std::int64_t k) {
    const Acc v = static_cast<Acc>(load(x));
    switch (r) {
      case Reduction::sum:
      case Reduction::mean: value += v; break;
      case Reduction::norm: value += v * v; break;
      case Reduction::max:
      case Reduction::argmax:
      case Reduction::min: {
        // NaN wins and stays, as in PyTorch's max/argmax.
        if (is_nan) break;
        if constexpr (!std::is_integral_v<T>) {
          if (std::isnan(static_cast<double>(v))) {
            is_nan = true;
            value = v;
            best_index = k;
            break;
          }
        }
        const bool better = r == Reduction::min ? v < value : v > value;
        if (best_index < 0 || better) {
          value = v;
          best_index = k;
        }
        break;
      }
    }
  }
  double result(Reduction r, std::int64_t n) const {
    switch (r) {
      case Reduction::mean: return static_cast<double>(value) / static_cast<double>(n);
      case Reduction::norm: return std::sqrt(static_cast<double>(value));
      case Reduction::argmax: return static_cast<double>(best_index);
      default: return static_cast<double>(value);
    }
  }
};

// sum and mean of f32/f64 (a Linear's bias gradient every step): Accumulator's sums,
// in the same order, without its per-element switch, so that the loop over `inner`
// vectorises (row_loops.hpp; f32 through math_loops' copies).
void sum_rows(const Tensor& t, Reduction r, std::int64_t outer, std::int64_t n, std::int64_t inner, Tensor& out) {
  std::vector<double> acc(static_cast<std::size_t>(inner));
  const bool mean = r == Reduction::mean;
  for (std::int64_t i = 0; i < outer; ++i) {
    if (t.dtype() == DType::f32)
      detail::math_loops()->sum_rows(t.data<float>() + i * n * inner, n, inner, mean, acc.data(),
                                     out.data<float>() + i * inner);
    else
      detail::sum_rows_loop(t.data<double>() + i * n * inner, n, inner, mean, acc.data(),
                            out.data<double>() + i * inner);
  }
}

Tensor reduce(const Tensor& t, Reduction r, std::int64_t dim, bool whole, bool keepdim) {
  const char* name = reduction_name(r);
  t.check_defined(name);
  if (r == Reduction::mean || r == Reduction::norm)
    TROUPE_CHECK(is_floating(t.dtype()), name, ": needs a floating dtype, got ", t.dtype());
  std::int64_t outer = 1, n = t.numel(), inner = 1;
  Shape out_shape;
  if (!whole) {
    const auto nd = t.dim();
    TROUPE_CHECK(nd > 0 && dim >= -nd && dim < nd, name, ": dimension ", dim, " out of range for shape ",
                 to_string(t.shape()));
    const auto d = static_cast<std::size_t>(dim < 0 ? dim + nd : dim);
    n = t.shape()[d];
    for (std::size_t i = 0; i < d; ++i) outer *= t.shape()[i];
    for (std::size_t i = d + 1; i < t.shape().size(); ++i) inner *= t.shape()[i];
    out_shape = t.shape();
    if (keepdim)
      out_shape[d] = 1;
    else
      out_shape.erase(out_shape.begin() + static_cast<std::ptrdiff_t>(d));
  }
  const bool needs_element = r == Reduction::max || r == Reduction::min || r == Reduction::argmax;
  TROUPE_CHECK(!(needs_element && n == 0 && outer * inner > 0), name, ": reducing ",
               whole ? "an empty tensor" : "an empty dimension", " of shape ", to_string(t.shape()),
               " has no identity");
  Tensor out = Tensor::empty(out_shape, result_dtype(r, t.dtype()), t.device());
  if (t.device().is_cuda()) {
    cuda_backend::reduce(cuda_reduction(r), t.dtype(), t.raw_data(), out.dtype(), out.raw_data(), outer, n, inner);
    return out;
  }
  if ((r == Reduction::sum || r == Reduction::mean) && (t.dtype() == DType::f32 || t.dtype() == DType::f64)) {
    sum_rows(t, r, outer, n, inner, out);
    return out;
  }
  dispatch(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = t.data<T>();
    std::vector<Accumulator<T>> acc(static_cast<std::size_t>(inner));
    dispatch(out.dtype(), [&](auto out_tag) {
      using O = decltype(out_tag);
      O* o = out.data<O>();
      for (std::int64_t i = 0; i < outer; ++i) {
        std::fill(acc.begin(), acc.end(), Accumulator<T>{});
        const T* block = in + i * n * inner;
        for (std::int64_t k = 0; k < n; ++k)
          for (std::int64_t j = 0; j < inner; ++j) acc[static_cast<std::size_t>(j)].add(r, block[k * inner + j], k);
        for (std::int64_t j = 0; j < inner; ++j)
          o[i * inner + j] = convert<O>(acc[static_cast<std::size_t>(j)].result(r, n));
      }
    });
  });
  return out;
}

}  // namespace

Tensor sum(const Tensor& t) { return reduce(t, Reduction::sum, 0, true, false); }
Tensor mean(const Tensor& t) { return reduce(t, Reduction::mean, 0, true, false); }
Tensor max(const Tensor& t) { return reduce(t, Reduction::max, 0, true, false); }
Tensor min(const Tensor& t) { return reduce(t, Reduction::min, 0, true, false); }
Tensor norm(const Tensor& t) { return reduce(t, Reduction::norm, 0, true, false); }
Tensor sum(const Tensor& t, std::int64_t dim, bool keepdim) { return reduce(t, Reduction::sum, dim, false, keepdim); }
Tensor mean(const Tensor& t, std::int64_t dim, bool keepdim) { return reduce(t, Reduction::mean, dim, false, keepdim); }
Tensor max(const Tensor& t, std::int64_t dim, bool keepdim) { return reduce(t, Reduction::max, dim, false, keepdim); }
Tensor min(const Tensor& t, std::int64_t dim, bool keepdim) { return reduce(t, Reduction::min, dim, false, keepdim); }
Tensor norm(const Tensor& t, std::int64_t dim, bool keepdim) { return reduce(t, Reduction::norm, dim, false, keepdim); }
Tensor argmax(const Tensor& t, std::int64_t dim, bool keepdim) {
  return reduce(t, Reduction::argmax, dim, false, keepdim);
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  a.check_defined("allclose");
  b.check_defined("allclose");
  if (a.shape() != b.shape()) return false;
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;  // also equal infinities
    if (!(std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]))) return false;
  }
  return true;
}

bool equal(const Tensor& a, const Tensor& b) {
  a.check_defined("equal");
  b.check_defined("equal");
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

}  // namespace troupe::tensor
