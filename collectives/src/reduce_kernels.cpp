#include "reduce_kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "troupe/tensor/half.hpp"

namespace troupe::collectives::detail {

namespace {

using tensor::BFloat16;
using tensor::Half;

template <class T>
struct Sum {
  static T apply(T a, T b) { return static_cast<T>(a + b); }
};
template <class T>
struct Prod {
  static T apply(T a, T b) { return static_cast<T>(a * b); }
};
template <class T>
struct Max {
  static T apply(T a, T b) { return std::max(a, b); }
};
template <class T>
struct Min {
  static T apply(T a, T b) { return std::min(a, b); }
};

// Plain loops over restrict-free pointers; GCC vectorises them at -O3 (dst may alias
// a or b element-for-element, which is fine for a vectorised loop).
template <class T, template <class> class F>
void combine(T* dst, const T* a, const T* b, std::size_t n, double scale) {
  if constexpr (std::is_floating_point_v<T>) {
    if (scale != 1.0) {
      const T s = static_cast<T>(scale);
      for (std::size_t i = 0; i < n; ++i) dst[i] = F<T>::apply(a[i], b[i]) * s;
      return;
    }
  }
  for (std::size_t i = 0; i < n; ++i) dst[i] = F<T>::apply(a[i], b[i]);
}

// bf16 <-> f32 without branches, so that GCC vectorises the loop (the scalar
// conversions in half.hpp branch on NaN, which keeps the loop scalar and 7x slower).
// Same rounding as float_to_bf16_bits: to nearest, ties to even, NaN kept quiet.
inline float widen_bf16(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint16_t narrow_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// 16-bit floats: widen the raw words to f32, combine, round once.
template <template <class> class F>
inline void combine_bf16_loop(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                              float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    dst[i] = narrow_bf16(F<float>::apply(widen_bf16(a[i]), widen_bf16(b[i])) * scale);
  }
}
// The same loop compiled for AVX2: the baseline (SSE2) has no 32 -> 16 bit pack and
// runs 3.5x slower, which made a bf16 allreduce no faster than f32 one of twice the bytes.
// AVX-512 (16 lanes, a native 32 -> 16 bit narrowing move) halves it again: the
// conversion, not memory, bounds a bf16 reduction in cache, as in the shared-memory path.
#if defined(__x86_64__) && defined(__GNUC__)
template <template <class> class F>
[[gnu::target("avx2")]] void combine_bf16_avx2(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* b,
                                               std::size_t n, float scale) {
  combine_bf16_loop<F>(dst, a, b, n, scale);
}
template <template <class> class F>
[[gnu::target("avx512f,avx512bw,avx512vl")]] void combine_bf16_avx512(std::uint16_t* dst, const std::uint16_t* a,
                                                                      const std::uint16_t* b, std::size_t n,
                                                                      float scale) {
  combine_bf16_loop<F>(dst, a, b, n, scale);
}
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
const bool kHaveAvx512 =
    __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
template <template <class> class F>
void combine_bf16_avx2(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* b, std::size_t n, float scale) {
  combine_bf16_loop<F>(dst, a, b, n, scale);
}
template <template <class> class F>
void combine_bf16_avx512(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* b, std::size_t n,
                         float scale) {
  combine_bf16_loop<F>(dst, a, b, n, scale);
}
const bool kHaveAvx2 = false;
const bool kHaveAvx512 = false;
#endif
template <template <class> class F>
void combine_bf16(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* b, std::size_t n, float scale) {
  if (kHaveAvx512) return combine_bf16_avx512<F>(dst, a, b, n, scale);
  if (kHaveAvx2) return combine_bf16_avx2<F>(dst, a, b, n, scale);
  combine_bf16_loop<F>(dst, a, b, n, scale);
}
template <template <class> class F>
void combine_f16(std::uint16_t* dst, const std::uint16_t* a, const std::uint16_t* b, std::size_t n, float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    const float r = F<float>::apply(tensor::half_bits_to_float(a[i]), tensor::half_bits_to_float(b[i])) * scale;
    dst[i] = tensor::float_to_half_bits(r);
  }
}

template <template <class> class F>
void reduce_with(DType dtype, void* dst, const void* a, const void* b, std::size_t n, double scale) {
  switch (dtype) {
    case DType::f32:
      return combine<float, F>(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b), n,
                               scale);
    case DType::f64:
      return combine<double, F>(static_cast<double*>(dst), static_cast<const double*>(a), static_cast<const double*>(b),
                                n, scale);
    case DType::i32:
      return combine<std::int32_t, F>(static_cast<std::int32_t*>(dst), static_cast<const std::int32_t*>(a),
                                      static_cast<const std::int32_t*>(b), n, 1.0);
    case DType::i64:
      return combine<std::int64_t, F>(static_cast<std::int64_t*>(dst), static_cast<const std::int64_t*>(a),
                                      static_cast<const std::int64_t*>(b), n, 1.0);
    case DType::u8:
      return combine<std::uint8_t, F>(static_cast<std::uint8_t*>(dst), static_cast<const std::uint8_t*>(a),
                                      static_cast<const std::uint8_t*>(b), n, 1.0);
    case DType::bf16:
      return combine_bf16<F>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(a),
                             static_cast<const std::uint16_t*>(b), n, static_cast<float>(scale));
    case DType::f16:
      return combine_f16<F>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(a),
                            static_cast<const std::uint16_t*>(b), n, static_cast<float>(scale));
  }
}

}  // namespace

void reduce(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, std::size_t count, double scale) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return reduce_with<Sum>(dtype, dst, a, b, count, scale);
    case ReduceOp::prod: return reduce_with<Prod>(dtype, dst, a, b, count, scale);
    case ReduceOp::max: return reduce_with<Max>(dtype, dst, a, b, count, scale);
    case ReduceOp::min: return reduce_with<Min>(dtype, dst, a, b, count, scale);
  }
}

void scale(DType dtype, void* data, std::size_t count, double factor) {
  switch (dtype) {
    case DType::f32: {
      auto* p = static_cast<float*>(data);
      const float f = static_cast<float>(factor);
      for (std::size_t i = 0; i < count; ++i) p[i] *= f;
      return;
    }
    case DType::f64: {
      auto* p = static_cast<double*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] *= factor;
      return;
    }
    case DType::bf16: {
      auto* p = static_cast<std::uint16_t*>(data);
      const float f = static_cast<float>(factor);
      for (std::size_t i = 0; i < count; ++i) p[i] = tensor::float_to_bf16_bits(tensor::bf16_bits_to_float(p[i]) * f);
      return;
    }
    case DType::f16: {
      auto* p = static_cast<std::uint16_t*>(data);
      const float f = static_cast<float>(factor);
      for (std::size_t i = 0; i < count; ++i) p[i] = tensor::float_to_half_bits(tensor::half_bits_to_float(p[i]) * f);
      return;
    }
    default: return;  // avg is rejected on integers before we get here
  }
}

}  // namespace troupe::collectives::detail
