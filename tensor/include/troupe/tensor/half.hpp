// IEEE binary16 (f16) and bfloat16 (bf16) as 16-bit words, with conversions to and
// from f32 that round to nearest, ties to even, and keep NaN, infinities and
// subnormals. The same functions compile for the host and, under nvcc, the device,
// so a cast gives the same bits on CPU and GPU. Host casts of whole f32 arrays use
// branch-free twins of these that GCC can vectorise (tensor/src/cast_host.cpp); a
// change here must be made there too, and tests/tensor/half_test.cpp checks both agree.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__
#else
#define TROUPE_HOST_DEVICE
#endif

namespace troupe::tensor {

namespace detail {
TROUPE_HOST_DEVICE inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
TROUPE_HOST_DEVICE inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

// f32 -> f16 bits. Normal numbers round by adding half an ulp of the target (plus the
// kept lowest bit, which makes ties go to even) before truncating; numbers below the
// smallest normal half are rounded by the FPU itself: adding 0.5f aligns their bits
// so that the hardware's own round-to-nearest-even does the work.
TROUPE_HOST_DEVICE inline std::uint16_t float_to_half_bits(float value) {
  std::uint32_t f = detail::float_bits(value);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  f &= 0x7fffffffu;
  if (f >= 0x7f800000u) {  // Inf stays Inf; NaN stays a quiet NaN with its top payload bits.
    return static_cast<std::uint16_t>(sign | 0x7c00u | (f > 0x7f800000u ? 0x200u | ((f >> 13) & 0x3ffu) : 0u));
  }
  if (f >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: Inf
  if (f < 0x38800000u) {                                                    // below 2^-14: a half subnormal or zero
    const std::uint32_t magic = 126u << 23;                                 // 0.5f
    const std::uint32_t o = detail::float_bits(detail::bits_float(f) + detail::bits_float(magic)) - magic;
    return static_cast<std::uint16_t>(sign | o);
  }
  const std::uint32_t odd = (f >> 13) & 1u;
  f += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + odd;
  return static_cast<std::uint16_t>(sign | (f >> 13));
}

TROUPE_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u) return detail::bits_float(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x0400u) return detail::bits_float(sign | ((em << 13) + (static_cast<std::uint32_t>(127 - 15) << 23)));
  const float magnitude = static_cast<float>(em) * 5.9604644775390625e-8f;  // em * 2^-24, exact
  return sign ? -magnitude : magnitude;
}

// f32 -> bf16 bits: bf16 is the top half of an f32, so rounding is one add. NaN is
// kept quiet (a NaN whose payload sat only in the low bits would otherwise become Inf).
TROUPE_HOST_DEVICE inline std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t f = detail::float_bits(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((f >> 16) | 0x0040u);
  f += 0x7fffu + ((f >> 16) & 1u);
  return static_cast<std::uint16_t>(f >> 16);
}

TROUPE_HOST_DEVICE inline float bf16_bits_to_float(std::uint16_t b) {
  return detail::bits_float(static_cast<std::uint32_t>(b) << 16);
}

// Storage types for the two 16-bit float dtypes. They convert to and from float
// implicitly so that kernels templated on the element type read like float code.
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  TROUPE_HOST_DEVICE Half(float f) : bits(float_to_half_bits(f)) {}  // NOLINT: implicit by design
  TROUPE_HOST_DEVICE operator float() const { return half_bits_to_float(bits); }
  TROUPE_HOST_DEVICE static Half from_bits(std::uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  TROUPE_HOST_DEVICE BFloat16(float f) : bits(float_to_bf16_bits(f)) {}  // NOLINT: implicit by design
  TROUPE_HOST_DEVICE operator float() const { return bf16_bits_to_float(bits); }
  TROUPE_HOST_DEVICE static BFloat16 from_bits(std::uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

}  // namespace troupe::tensor
