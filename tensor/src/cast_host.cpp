// detail::cast_host: dst[i] = convert(src[i]) over host arrays of two dtypes.
//
// Any pair goes through convert<D>(S), one element at a time. The four pairs that
// move training data between f32 and the 16-bit floats (f32 <-> f16, f32 <-> bf16)
// take a fast path instead: loops over raw float / uint16_t arrays whose bodies GCC
// vectorises at plain -O3, with no -march, so with SSE2 alone and on any x86-64.
//
// Why the conversions are written again here. The scalar ones in half.hpp branch on
// the class of the input (NaN, overflow, subnormal, normal). A branch in a loop body
// stops the vectoriser, and a ternary does not help: GCC sinks the work only one arm
// uses into a branch of its own, and will not turn a block that does float arithmetic
// back into a select (the add might trap, as far as it knows). So the functions below
// compute every arm for every element and pick one with bit masks,
// (a & m) | (b & ~m), straight-line code that becomes and/andnot/or on vectors.
// Comparisons are on int32 (magnitudes, below 2^31), because SSE2 only compares signed.
// In f32 -> f16 the arms are kept at the bit position where the half's exponent and
// mantissa sit in the f32 (bits 13..27) and shifted down once at the end: selecting
// on the shifted values lets GCC do the selects on 16-bit lanes, and it then narrows
// every mask and arm from 32 bits separately, which cost more than the selects.
//
// The loops are compiled twice on x86-64: as above, and for AVX2 (twice the width,
// three-operand instructions, a real pack), picked once per process from what the CPU
// reports. Both return exactly the bits of the scalar twins in half.hpp, which are
// the arms used here. tests/tensor/half_test.cpp checks every compiled copy against
// them for all 65536 16-bit patterns and millions of f32 ones; keep them in step.
#include <bit>
#include <cstdint>

#include "convert.hpp"

namespace troupe::tensor::detail {

namespace {

// All ones where `condition` holds, else zero; and a branch-free select by such a mask.
inline std::uint32_t mask_if(bool condition) { return 0u - static_cast<std::uint32_t>(condition); }
inline std::uint32_t select(std::uint32_t mask, std::uint32_t if_set, std::uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

// float_to_half_bits without branches, every arm shifted left by 13. `a` is the
// magnitude's bits. Normal: rebias the exponent and round to nearest even by adding
// half an ulp (0xfff) plus the kept lowest bit; a carry out of the mantissa is the
// right answer, up to Inf at 65520. Below 2^-14 the FPU rounds (see half.hpp).
// From 65536 up: Inf, or a quiet NaN keeping the payload's top bits.
inline std::uint16_t to_half_bits(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t a = f & 0x7fffffffu;
  const auto magnitude = static_cast<std::int32_t>(a);
  const std::uint32_t normal = a - (static_cast<std::uint32_t>(127 - 15) << 23) + 0xfffu + ((a >> 13) & 1u);
  // For large `a` (NaN bits included) this lane computes garbage, quietly; the select drops it.
  const std::uint32_t subnormal =
      (std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - std::bit_cast<std::uint32_t>(0.5f)) << 13;
  const std::uint32_t quiet_nan = (0x200u << 13) | (a & (0x3ffu << 13));  // the payload's top bits
  const std::uint32_t special = (0x7c00u << 13) | (mask_if(magnitude > 0x7f800000) & quiet_nan);
  std::uint32_t r = select(mask_if(magnitude < 0x38800000), subnormal, normal);  // below 2^-14
  r = select(mask_if(magnitude >= 0x47800000), special, r);                      // 65536 and up
  const std::uint32_t sign = (f >> 3) & (0x8000u << 13);
  return static_cast<std::uint16_t>((sign | r) >> 13);
}

// half_bits_to_float without branches. Normal numbers move their exponent from bias 15
// to 127; Inf and NaN (exponent 31) move it twice as far, to 255. Subnormals are
// em * 2^-24, exact (the int conversion is the one SSE2 has; em < 2^15 fits).
inline float from_half_bits(std::uint16_t h) {
  const std::uint32_t em = h & 0x7fffu;
  const auto magnitude = static_cast<std::int32_t>(em);
  const std::uint32_t rebias = static_cast<std::uint32_t>(127 - 15) << 23;
  const std::uint32_t normal = (em << 13) + rebias + (mask_if(magnitude >= 0x7c00) & rebias);
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(static_cast<float>(magnitude) * 0x1p-24f);
  const std::uint32_t r = select(mask_if(magnitude < 0x400), subnormal, normal);
  return std::bit_cast<float>((static_cast<std::uint32_t>(h & 0x8000u) << 16) | r);
}

// float_to_bf16_bits without branches: round by adding 0x7fff plus the kept lowest
// bit, except for a NaN, which is kept and made quiet.
inline std::uint16_t to_bf16_bits(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t nan = mask_if(static_cast<std::int32_t>(f & 0x7fffffffu) > 0x7f800000);
  const std::uint32_t r = (f + ((0x7fffu + ((f >> 16) & 1u)) & ~nan)) | (nan & 0x00400000u);
  return static_cast<std::uint16_t>(r >> 16);
}

inline float from_bf16_bits(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

// One loop for all four, inlined into each compiled copy so it is vectorised there.
// In and Out differ (float / uint16_t), so the arrays cannot alias and GCC needs no
// run-time overlap check.
template <auto convert, class In, class Out>
[[gnu::always_inline]] inline void convert_all(const In* in, Out* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = convert(in[i]);
}

struct Loops {
  void (*f32_to_f16)(const float*, std::uint16_t*, std::int64_t);
  void (*f16_to_f32)(const std::uint16_t*, float*, std::int64_t);
  void (*f32_to_bf16)(const float*, std::uint16_t*, std::int64_t);
  void (*bf16_to_f32)(const std::uint16_t*, float*, std::int64_t);
};

constexpr Loops kBaselineLoops = {
    [](const float* in, std::uint16_t* out, std::int64_t n) { convert_all<to_half_bits>(in, out, n); },
    [](const std::uint16_t* in, float* out, std::int64_t n) { convert_all<from_half_bits>(in, out, n); },
    [](const float* in, std::uint16_t* out, std::int64_t n) { convert_all<to_bf16_bits>(in, out, n); },
    [](const std::uint16_t* in, float* out, std::int64_t n) { convert_all<from_bf16_bits>(in, out, n); },
};

#if defined(__x86_64__) && defined(__GNUC__)
[[gnu::target("avx2")]] void f32_to_f16_avx2(const float* in, std::uint16_t* out, std::int64_t n) {
  convert_all<to_half_bits>(in, out, n);
}
[[gnu::target("avx2")]] void f16_to_f32_avx2(const std::uint16_t* in, float* out, std::int64_t n) {
  convert_all<from_half_bits>(in, out, n);
}
[[gnu::target("avx2")]] void f32_to_bf16_avx2(const float* in, std::uint16_t* out, std::int64_t n) {
  convert_all<to_bf16_bits>(in, out, n);
}
[[gnu::target("avx2")]] void bf16_to_f32_avx2(const std::uint16_t* in, float* out, std::int64_t n) {
  convert_all<from_bf16_bits>(in, out, n);
}
constexpr Loops kAvx2Loops = {f32_to_f16_avx2, f16_to_f32_avx2, f32_to_bf16_avx2, bf16_to_f32_avx2};
constexpr const Loops* kAvx2 = &kAvx2Loops;
#else
constexpr const Loops* kAvx2 = nullptr;
#endif

// The loops `which` names, or null where they do not run on this CPU.
const Loops* loops_for(HostLoops which) { return pick_loops(which, &kBaselineLoops, kAvx2); }

}  // namespace

bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  // libgcc's check covers the OS saving the AVX registers (XCR0), not just CPUID.
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512dq") != 0 &&
           __builtin_cpu_supports("avx512bw") != 0 && __builtin_cpu_supports("avx512vl") != 0;
  }();
  return has;
#else
  return false;
#endif
}

bool cast_loops_available(HostLoops which) { return loops_for(which) != nullptr; }

void cast_host(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, HostLoops which) {
  // Half and BFloat16 are a lone uint16_t each, so their arrays are read and written
  // as uint16_t here.
  static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2 && alignof(Half) == alignof(std::uint16_t));
  const Loops* loops = loops_for(which);
  TROUPE_CHECK(loops != nullptr, "cast_host: the requested compiled loops do not run on this CPU");
  const auto* in_f32 = static_cast<const float*>(src);
  const auto* in_u16 = static_cast<const std::uint16_t*>(src);
  auto* out_f32 = static_cast<float*>(dst);
  auto* out_u16 = static_cast<std::uint16_t*>(dst);
  if (src_dtype == DType::f32 && dst_dtype == DType::f16) return loops->f32_to_f16(in_f32, out_u16, n);
  if (src_dtype == DType::f16 && dst_dtype == DType::f32) return loops->f16_to_f32(in_u16, out_f32, n);
  if (src_dtype == DType::f32 && dst_dtype == DType::bf16) return loops->f32_to_bf16(in_f32, out_u16, n);
  if (src_dtype == DType::bf16 && dst_dtype == DType::f32) return loops->bf16_to_f32(in_u16, out_f32, n);

  dispatch(src_dtype, [&](auto s) {
    using S = decltype(s);
    dispatch(dst_dtype, [&](auto d) {
      using D = decltype(d);
      const S* in = static_cast<const S*>(src);
      D* out = static_cast<D*>(dst);
      for (std::int64_t i = 0; i < n; ++i) out[i] = convert<D>(in[i]);
    });
  });
}

}  // namespace troupe::tensor::detail
