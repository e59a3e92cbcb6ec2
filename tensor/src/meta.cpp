#include "troupe/tensor/meta.hpp"

#include <algorithm>

#include "convert.hpp"
#include "philox.hpp"
#include "troupe/error.hpp"

namespace troupe::tensor {

namespace {

constexpr std::int64_t kStagingElements = std::int64_t{1} << 20;

// Elements [first, first + n) of the storage described by `fill`, in dtype T.
template <class T>
void compute(T* out, const MetaFill& fill, std::uint64_t first, std::int64_t n) {
  switch (fill.kind) {
    case MetaFill::Kind::constant: {
      const T v = detail::convert<T>(fill.a);
      std::fill(out, out + n, v);
      return;
    }
    case MetaFill::Kind::uniform:
      for (std::int64_t i = 0; i < n; ++i)
        out[i] =
            detail::convert<T>(fill.a + (fill.b - fill.a) * detail::philox_uniform(fill.seed, fill.offset, first + i));
      return;
    case MetaFill::Kind::normal:
      for (std::int64_t i = 0; i < n; ++i)
        out[i] = detail::convert<T>(fill.a + fill.b * detail::philox_normal(fill.seed, fill.offset, first + i));
      return;
    case MetaFill::Kind::unset: break;
  }
}

}  // namespace

namespace detail {

void describe_meta_fill(const Tensor& t, const MetaFill& fill, const char* op) {
  TROUPE_CHECK(t.offset() == 0 && t.nbytes() == t.storage()->nbytes(), op, ": a meta tensor can only be described ",
               "whole; this ", to_string(t.shape()), " view covers part of its storage");
  t.storage()->set_meta_fill(fill);
}

}  // namespace detail

void materialize_into(const Tensor& dst, const Tensor& meta, std::int64_t begin) {
  dst.check_defined("materialize_into");
  meta.check_defined("materialize_into");
  TROUPE_CHECK(meta.device().is_meta(), "materialize_into: the source is on ", meta.device(), ", not the meta device");
  TROUPE_CHECK(!dst.device().is_meta(), "materialize_into: the destination is on the meta device");
  TROUPE_CHECK(begin >= 0 && begin + dst.numel() <= meta.numel(), "materialize_into: elements [", begin, ", ",
               begin + dst.numel(), ") lie outside the ", meta.numel(), "-element meta tensor ",
               to_string(meta.shape()));
  const MetaFill& fill = meta.storage()->meta_fill();
  TROUPE_CHECK(fill.kind != MetaFill::Kind::unset, "materialize_into: the ", dtype_name(meta.dtype()), " ",
               to_string(meta.shape()), " meta tensor was never initialised (no fill_, zeros, uniform_ or normal_)");
  const auto first = static_cast<std::uint64_t>(meta.offset() + begin);
  const bool direct = dst.device().is_cpu() && dst.dtype() == meta.dtype();
  dispatch(meta.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (direct) {
      compute(dst.data<T>(), fill, first, dst.numel());
      return;
    }
    Tensor staging = Tensor::empty({std::min(dst.numel(), kStagingElements)}, meta.dtype());
    const Tensor flat = dst.flatten();
    for (std::int64_t at = 0; at < dst.numel(); at += kStagingElements) {
      const std::int64_t n = std::min(kStagingElements, dst.numel() - at);
      Tensor block = staging.slice(0, n);
      compute(block.data<T>(), fill, first + static_cast<std::uint64_t>(at), n);
      flat.slice(at, at + n).copy_(block);
    }
  });
}

Tensor materialize(const Tensor& meta, Device device) {
  Tensor out = Tensor::empty(meta.shape(), meta.dtype(), device);
  materialize_into(out, meta, 0);
  return out;
}

}  // namespace troupe::tensor
