// Philox-4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as
// 1, 2, 3", SC'11): ten rounds of two 32x32->64-bit multiplies and a key schedule
// turn a 128-bit counter and a 64-bit key into four random words. Being a pure
// function of (counter, key), it gives the same stream on any thread or device.
#pragma once

#include <cmath>
#include <cstdint>

#include "troupe/tensor/half.hpp"

namespace troupe::tensor::detail {

struct PhiloxWords {
  std::uint32_t w[4];
};

TROUPE_HOST_DEVICE inline PhiloxWords philox4x32_10(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                                    std::uint32_t c3, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;  // the golden ratio and sqrt(3)-1, Weyl increments of the key
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Block `block` of the stream for `seed`: counter = (block, 0), key = seed.
TROUPE_HOST_DEVICE inline PhiloxWords philox_block(std::uint64_t seed, std::uint64_t block) {
  return philox4x32_10(static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0, 0,
                       static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// Element i of a uniform draw starting at block `offset`: one word, mapped to [0, 1).
TROUPE_HOST_DEVICE inline double philox_uniform(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  const PhiloxWords r = philox_block(seed, offset + i / 4);
  return r.w[i % 4] * 2.3283064365386963e-10;  // 2^-32
}

// Element i of a standard normal draw: each block holds two Box-Muller pairs.
// Computed in double so that host and device libm agree after rounding to the dtype.
TROUPE_HOST_DEVICE inline double philox_normal(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  const PhiloxWords r = philox_block(seed, offset + i / 4);
  const unsigned lane = static_cast<unsigned>(i % 4);
  const unsigned pair = lane / 2;
  const double u1 = (r.w[2 * pair] + 0.5) * 2.3283064365386963e-10;  // (0, 1): log is finite
  const double u2 = r.w[2 * pair + 1] * 2.3283064365386963e-10;
  const double radius = ::sqrt(-2.0 * ::log(u1));
  const double angle = 6.283185307179586 * u2;
  return lane % 2 == 0 ? radius * ::cos(angle) : radius * ::sin(angle);
}

}  // namespace troupe::tensor::detail
