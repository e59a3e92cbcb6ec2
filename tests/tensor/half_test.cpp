// f16 and bf16 conversions against known bit patterns, and exhaustive round trips;
// then the bulk host casts (branch-free, vectorised twins of these functions, run by
// Tensor::copy_ between f32 and f16/bf16) against the scalar functions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../../tensor/src/convert.hpp"
#include "troupe/tensor/half.hpp"

using namespace troupe::tensor;

namespace {
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
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
  EXPECT_EQ(float_to_half_bits(65519.0f), 0x7BFF);                          // just below the overflow tie
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00);                          // the tie goes to Inf
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
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F808000u)), 0x3F80);             // tie -> even
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F818000u)), 0x3F82);             // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F808001u)), 0x3F81);             // above the tie
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x00018000u)), 0x0002);             // subnormal tie -> even
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x00010000u)), 0x0001);             // subnormal, exact
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

// ---- bulk casts against the scalar functions ----
//
// troupe::tensor::detail::cast_host converts f32 <-> f16 and f32 <-> bf16 with loops of its own
// (tensor/src/cast_host.cpp), compiled once for any x86-64 and once for AVX2. Every
// copy this CPU can run must give the very bits of the scalar functions above: for
// every 16-bit pattern, and for f32 patterns chosen to hit every arm of the f32 ->
// 16-bit conversions. (A copy the CPU lacks is not checked here; the baseline always is.)

namespace {

using troupe::tensor::detail::HostLoops;

std::vector<HostLoops> loops_on_this_cpu() {
  std::vector<HostLoops> found;
  for (const HostLoops loops : {HostLoops::baseline, HostLoops::avx2, HostLoops::avx512, HostLoops::best})
    if (troupe::tensor::detail::cast_loops_available(loops)) found.push_back(loops);
  return found;
}

const char* name(HostLoops loops) {
  switch (loops) {
    case HostLoops::baseline: return "baseline loops";
    case HostLoops::avx2: return "AVX2 loops";
    case HostLoops::avx512: return "AVX-512 loops";
    case HostLoops::best: return "best loops";
  }
  return "?";
}

std::vector<std::uint16_t> every_16_bit_pattern() {
  std::vector<std::uint16_t> all(0x10000);
  for (std::uint32_t i = 0; i < 0x10000; ++i) all[i] = static_cast<std::uint16_t>(i);
  return all;
}

// A few million f32 values, both signs of each: around every f16 and bf16 value (the
// value, the tie halfway to the next one, and one f32 ulp either side of both), NaNs
// with payloads high, only in the bits a conversion drops, or everywhere, the f16
// overflow boundary, f32 subnormals, then a stride through all 2^32 patterns and
// random ones.
std::vector<float> f32_patterns() {
  std::vector<std::uint32_t> p;
  auto near = [&p](std::uint32_t u) {
    for (std::uint32_t d : {0u, 1u, 0xffffffffu}) p.push_back(u + d);  // u, u + 1, u - 1
  };
  for (std::uint32_t h = 0; h < 0x8000; ++h) {
    const float half = half_bits_to_float(static_cast<std::uint16_t>(h));
    near(to_bits(half));
    if (h < 0x7c00) {  // the tie with the next half (65536 past the largest), exact in f32
      const float next = h == 0x7bff ? 65536.0f : half_bits_to_float(static_cast<std::uint16_t>(h + 1));
      near(to_bits((half + next) / 2));
    }
    near(h << 16);              // a bf16 value
    near((h << 16) | 0x8000u);  // the bf16 tie
  }
  for (std::uint32_t payload = 1; payload < 0x800000u; payload = payload * 3 + 1) {
    p.push_back(0x7f800000u | payload);              // NaN, payload anywhere
    p.push_back(0x7f800000u | (payload & 0x1fffu));  // only in the bits f16 drops
    p.push_back(0x7f800000u | (payload & 0xffffu));  // only in the bits bf16 drops
  }
  for (std::uint32_t u = 0x477fe000u; u < 0x47800100u; ++u) p.push_back(u);  // 65504 .. past 65536
  for (std::uint32_t u = 0; u < 0x20000u; ++u) p.push_back(u);               // the smallest f32 subnormals
  for (std::uint32_t u : {0x7f800000u, 0x7f7fffffu, 0x007fffffu, 0x00800000u, 0x7fffffffu, 0x7fc00000u}) p.push_back(u);
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) p.push_back(static_cast<std::uint32_t>(u));
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) p.push_back(rng());
  std::vector<float> values;
  values.reserve(2 * p.size());
  for (const std::uint32_t u : p) values.push_back(from_bits(u));
  for (const std::uint32_t u : p) values.push_back(from_bits(u ^ 0x80000000u));
  return values;
}

}  // namespace

TEST(HostCast, F16AndBf16ToF32MatchTheScalarFunctionsForEvery16BitPattern) {
  const std::vector<std::uint16_t> in = every_16_bit_pattern();
  std::vector<float> out(in.size());
  for (const HostLoops loops : loops_on_this_cpu()) {
    troupe::tensor::detail::cast_host(in.data(), DType::f16, out.data(), DType::f32, 0x10000, loops);
    for (std::uint32_t h = 0; h < 0x10000; ++h)
      ASSERT_EQ(to_bits(out[h]), to_bits(half_bits_to_float(in[h]))) << name(loops) << ", f16 " << std::hex << h;
    troupe::tensor::detail::cast_host(in.data(), DType::bf16, out.data(), DType::f32, 0x10000, loops);
    for (std::uint32_t b = 0; b < 0x10000; ++b)
      ASSERT_EQ(to_bits(out[b]), to_bits(bf16_bits_to_float(in[b]))) << name(loops) << ", bf16 " << std::hex << b;
  }
}

TEST(HostCast, F32ToF16AndBf16MatchTheScalarFunctionsOnMillionsOfPatterns) {
  const std::vector<float> in = f32_patterns();
  ASSERT_GT(in.size(), 4'000'000u);
  const auto n = static_cast<std::int64_t>(in.size());
  std::vector<std::uint16_t> half(in.size()), bf16(in.size());
  for (const HostLoops loops : loops_on_this_cpu()) {
    troupe::tensor::detail::cast_host(in.data(), DType::f32, half.data(), DType::f16, n, loops);
    troupe::tensor::detail::cast_host(in.data(), DType::f32, bf16.data(), DType::bf16, n, loops);
    for (std::size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(half[i], float_to_half_bits(in[i])) << name(loops) << ", f32 " << std::hex << to_bits(in[i]);
      ASSERT_EQ(bf16[i], float_to_bf16_bits(in[i])) << name(loops) << ", f32 " << std::hex << to_bits(in[i]);
    }
  }
}

// The vectorised loops run in blocks with a scalar remainder: short runs at odd places
// must come out as whole arrays do, and write nothing outside their range.
TEST(HostCast, ShortRunsAtAnyOffsetMatchTheScalarFunctionsAndWriteNothingElse) {
  std::vector<float> in(64);
  std::mt19937 rng(11);
  for (auto& f : in) f = from_bits(rng() & 0x8fffffffu);  // mostly small: subnormal and normal halves
  in[5] = from_bits(0x7f800001u);                         // and a NaN, an Inf, a tie
  in[17] = from_bits(0xff800000u);
  in[30] = from_bits(0x3f801000u);
  const std::uint16_t guard = 0xdead;
  for (const HostLoops loops : loops_on_this_cpu())
    for (const DType dtype : {DType::f16, DType::bf16})
      for (std::size_t begin = 0; begin < 4; ++begin)
        for (std::size_t end = begin; end <= 40; ++end) {
          const auto n = static_cast<std::int64_t>(end - begin);
          std::vector<std::uint16_t> out(64, guard);
          std::vector<float> back(64, -1.0f);
          troupe::tensor::detail::cast_host(in.data() + begin, DType::f32, out.data() + begin, dtype, n, loops);
          troupe::tensor::detail::cast_host(out.data() + begin, dtype, back.data() + begin, DType::f32, n, loops);
          for (std::size_t i = 0; i < 64; ++i) {
            const bool inside = begin <= i && i < end;
            const std::uint16_t want = !inside               ? guard
                                       : dtype == DType::f16 ? float_to_half_bits(in[i])
                                                             : float_to_bf16_bits(in[i]);
            const float back_want = !inside               ? -1.0f
                                    : dtype == DType::f16 ? half_bits_to_float(want)
                                                          : bf16_bits_to_float(want);
            ASSERT_EQ(out[i], want) << name(loops) << ", " << dtype_name(dtype) << " [" << begin << ", " << end
                                    << ") at " << i;
            ASSERT_EQ(to_bits(back[i]), to_bits(back_want))
                << name(loops) << ", back from " << dtype_name(dtype) << " [" << begin << ", " << end << ") at " << i;
          }
        }
}

TEST(HostCast, TheBaselineLoopsRunEverywhere) {
  EXPECT_TRUE(troupe::tensor::detail::cast_loops_available(HostLoops::baseline));
  EXPECT_TRUE(troupe::tensor::detail::cast_loops_available(HostLoops::best));
}
