#include "troupe/tensor/random.hpp"

#include "convert.hpp"
#include "cuda/cuda_backend.hpp"
#include "philox.hpp"
#include "troupe/tensor/meta.hpp"

namespace troupe::tensor {

namespace {

enum class Distribution { uniform, normal };

void draw(Tensor& t, Distribution dist, double a, double b, Generator& gen, const char* op) {
  t.check_defined(op);
  TROUPE_CHECK(is_floating(t.dtype()), op, ": needs a floating dtype, got ", t.dtype());
  const auto n = static_cast<std::uint64_t>(t.numel());
  // Every draw claims whole blocks, so the next draw never reuses a word.
  const std::uint64_t offset = gen.reserve((n + 3) / 4);
  if (t.device().is_meta()) {  // described, to be materialised later with the same words
    detail::describe_meta_fill(
        t, {dist == Distribution::uniform ? MetaFill::Kind::uniform : MetaFill::Kind::normal, a, b, gen.seed(), offset},
        op);
    return;
  }
  if (t.device().is_cuda()) {
    if (dist == Distribution::uniform)
      cuda_backend::random_uniform(t.dtype(), t.raw_data(), t.numel(), gen.seed(), offset, a, b);
    else
      cuda_backend::random_normal(t.dtype(), t.raw_data(), t.numel(), gen.seed(), offset, a, b);
    return;
  }
  const std::uint64_t seed = gen.seed();
  dispatch_floating(t.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.data<T>();
    for (std::uint64_t i = 0; i < n; ++i) {
      const double v = dist == Distribution::uniform ? a + (b - a) * detail::philox_uniform(seed, offset, i)
                                                     : a + b * detail::philox_normal(seed, offset, i);
      p[i] = detail::convert<T>(v);
    }
  });
}

}  // namespace

void uniform_(Tensor& t, double lo, double hi, Generator& gen) {
  TROUPE_CHECK(lo <= hi, "uniform: lower bound ", lo, " is above upper bound ", hi);
  draw(t, Distribution::uniform, lo, hi, gen, "uniform");
}

void normal_(Tensor& t, double mean, double std, Generator& gen) {
  TROUPE_CHECK(std >= 0, "normal: standard deviation must be >= 0, got ", std);
  draw(t, Distribution::normal, mean, std, gen, "normal");
}

Tensor uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  uniform_(t, lo, hi, gen);
  return t;
}

Tensor normal(const Shape& shape, double mean, double std, Generator& gen, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  normal_(t, mean, std, gen);
  return t;
}

}  // namespace troupe::tensor
