// Element conversions between dtypes on the host, shared by copies, casts and
// reductions. f16/bf16 go through float, as their arithmetic does.
#pragma once

#include <cstdint>
#include <type_traits>

#include "troupe/tensor/dtype.hpp"

namespace troupe::tensor::detail {

template <class T>
constexpr bool is_half_like = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Value of x in its compute type (float for f16/bf16).
template <class T>
inline compute_t<T> load(T x) {
  if constexpr (is_half_like<T>)
    return static_cast<float>(x);
  else
    return x;
}

// A floating value goes to u8 through i64, wrapping modulo 256 (what x86 does for
// in-range i32 values, and what PyTorch's CPU casts do): float -> u8 directly is
// undefined out of range, and GPUs saturate where x86 wraps.
template <class D, class S>
inline D convert(S x) {
  if constexpr (std::is_same_v<D, S>) {
    return x;
  } else if constexpr (is_half_like<D>) {
    return D(static_cast<float>(load(x)));
  } else if constexpr (std::is_same_v<D, std::uint8_t> && !std::is_integral_v<S>) {
    return static_cast<D>(static_cast<std::int64_t>(load(x)));
  } else {
    return static_cast<D>(load(x));
  }
}

// Which compiled copy of the multiply compiled host loops runs (cast_host's f32 <->
// f16 / bf16 loops here, math_loops.hpp's). `best` is the widest copy the CPU runs:
// AVX-512 (math_loops only), else AVX2, else the baseline (SSE2 on x86-64); the others
// are there so tests can check each copy on a machine that would only ever pick one.
enum class HostLoops { best, baseline, avx2, avx512 };

// Whether this CPU (and its OS, which must save the AVX registers) runs AVX2 code.
bool cpu_has_avx2();
// The same for AVX-512 F, DQ, BW and VL (x86-64-v4), the OS saving the ZMM registers.
bool cpu_has_avx512();

// The table of loops `which` names, given each compiled copy (null where a copy is
// not compiled); null for a copy the CPU cannot run.
template <class Loops>
const Loops* pick_loops(HostLoops which, const Loops* baseline, const Loops* avx2, const Loops* avx512 = nullptr) {
  if (which == HostLoops::baseline) return baseline;
  const Loops* v3 = cpu_has_avx2() ? avx2 : nullptr;
  const Loops* v4 = cpu_has_avx512() ? avx512 : nullptr;
  if (which == HostLoops::avx2) return v3;
  if (which == HostLoops::avx512) return v4;
  return v4 != nullptr ? v4 : v3 != nullptr ? v3 : baseline;
}
bool cast_loops_available(HostLoops which);

// dst[i] = convert(src[i]) for n elements of the given dtypes, both on the host.
// f32 <-> f16 and f32 <-> bf16 take vectorised loops with the same bits
// (cast_host.cpp); asking for loops the CPU lacks is an error.
void cast_host(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n,
               HostLoops which = HostLoops::best);

}  // namespace troupe::tensor::detail
