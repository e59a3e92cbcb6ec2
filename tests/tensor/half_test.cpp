// f16 and bf16 conversions against known bit patterns, and exhaustive round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "troupe/tensor/half.hpp"

using namespace troupe::tensor;

namespace {
float from_bits(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
std::uint32_t to_bits(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; }
}  // namespace

TEST(Half, RoundsNormalNumbersToKnownBitPatterns) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half_bits(0.1f), 0x2E66);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
}

TEST(Half, BreaksTiesToEven) {
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // halfway, 0x3C00 is even
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // halfway, rounds up to even
  EXPECT_EQ(float_to_half_bits(65519.0f), 0x7BFF);                           // just below the overflow tie
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00);                           // the tie goes to Inf
}

TEST(Half, RoundsSubnormalsToNearestEven) {
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);      // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);      // tie between 0 and 1 -> 0
  EXPECT_EQ(float_to_half_bits(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie between 1 and 2 -> 2
  EXPECT_EQ(float_to_half_bits(1023 * std::ldexp(1.0f, -24)), 0x03FF);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -30)), 0x0000);  // underflows to +0
  EXPECT_EQ(half_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_bits_to_float(0x83FF), -1023 * std::ldexp(1.0f, -24));
}

TEST(Half, KeepsInfinitiesAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_half_bits(inf), 0x7C00);
  EXPECT_EQ(float_to_half_bits(-inf), 0xFC00);
  EXPECT_EQ(float_to_half_bits(1e10f), 0x7C00);
  const std::uint16_t nan = float_to_half_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  // A NaN whose payload sits only in bits dropped by the conversion must not become Inf.
  EXPECT_NE(float_to_half_bits(from_bits(0x7F800001u)) & 0x03FF, 0);
  EXPECT_TRUE(std::isinf(half_bits_to_float(0xFC00)));
  EXPECT_TRUE(std::isnan(half_bits_to_float(0x7E00)));
}

TEST(Half, EveryNonNaNBitPatternSurvivesARoundTripThroughFloat) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_bits_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(f)))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(float_to_half_bits(f), h) << std::hex << h;
  }
}

TEST(BFloat16, RoundsToKnownBitPatterns) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(3.14159265f), 0x4049);
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F808000u)), 0x3F80);  // tie -> even
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F818000u)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x00018000u)), 0x0002);  // subnormal tie -> even
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x00010000u)), 0x0001);  // subnormal, exact
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds to Inf
}

TEST(BFloat16, KeepsInfinitiesAndNaN) {
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  const std::uint16_t nan = float_to_bf16_bits(from_bits(0xFF800001u));  // payload only in low bits
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(nan)));
  EXPECT_EQ(nan & 0x8000, 0x8000);
}

TEST(BFloat16, EveryNonNaNBitPatternSurvivesARoundTripThroughFloat) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_bits_to_float(static_cast<std::uint16_t>(b));
    EXPECT_EQ(to_bits(f), b << 16);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16_bits(f), b) << std::hex << b;
  }
}
