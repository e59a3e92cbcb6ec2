// XXH64 as specified in xxHash's doc/xxhash_spec.md: four lanes of 8-byte "rounds" over
// 32-byte stripes, merged and then mixed with the remaining 8-, 4- and 1-byte pieces.
// Input is read little-endian (memcpy, so unaligned tensors are fine).
#include "troupe/checkpoint/xxhash64.hpp"

#include <cstring>

namespace troupe::checkpoint {

namespace {

constexpr std::uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr std::uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr std::uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr std::uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline std::uint64_t read64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // x86-64 and aarch64 Linux are little-endian, as the format requires
}
inline std::uint32_t read32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline std::uint64_t round(std::uint64_t acc, std::uint64_t lane) {
  acc += lane * kP2;
  acc = rotl(acc, 31);
  return acc * kP1;
}
inline std::uint64_t merge(std::uint64_t acc, std::uint64_t v) {
  acc ^= round(0, v);
  return acc * kP1 + kP4;
}

}  // namespace

Xxh64::Xxh64(std::uint64_t seed) : state_{} {
  state_.seed = seed;
  state_.v[0] = seed + kP1 + kP2;
  state_.v[1] = seed + kP2;
  state_.v[2] = seed;
  state_.v[3] = seed - kP1;
}

void Xxh64::update(const void* data, std::size_t size) {
  State& s = state_;
  const auto* p = static_cast<const unsigned char*>(data);
  s.total += size;
  if (s.buffered + size < 32) {
    if (size) std::memcpy(s.buffer + s.buffered, p, size);
    s.buffered += size;
    return;
  }
  if (s.buffered) {
    std::size_t fill = 32 - s.buffered;
    std::memcpy(s.buffer + s.buffered, p, fill);
    for (int i = 0; i < 4; ++i) s.v[i] = round(s.v[i], read64(s.buffer + 8 * i));
    p += fill;
    size -= fill;
    s.buffered = 0;
  }
  // The hot loop: four independent lanes so the multiplies pipeline.
  std::uint64_t a = s.v[0], b = s.v[1], c = s.v[2], d = s.v[3];
  while (size >= 32) {
    a = round(a, read64(p));
    b = round(b, read64(p + 8));
    c = round(c, read64(p + 16));
    d = round(d, read64(p + 24));
    p += 32;
    size -= 32;
  }
  s.v[0] = a, s.v[1] = b, s.v[2] = c, s.v[3] = d;
  if (size) std::memcpy(s.buffer, p, size);
  s.buffered = size;
}

std::uint64_t Xxh64::digest() const {
  const State& s = state_;
  std::uint64_t h;
  if (s.total >= 32) {
    h = rotl(s.v[0], 1) + rotl(s.v[1], 7) + rotl(s.v[2], 12) + rotl(s.v[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, s.v[i]);
  } else {
    h = s.seed + kP5;
  }
  h += s.total;
  const unsigned char* p = s.buffer;
  std::size_t left = s.buffered;
  while (left >= 8) {
    h ^= round(0, read64(p));
    h = rotl(h, 27) * kP1 + kP4;
    p += 8;
    left -= 8;
  }
  if (left >= 4) {
    h ^= static_cast<std::uint64_t>(read32(p)) * kP1;
    h = rotl(h, 23) * kP2 + kP3;
    p += 4;
    left -= 4;
  }
  while (left > 0) {
    h ^= (*p) * kP5;
    h = rotl(h, 11) * kP1;
    ++p;
    --left;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed) {
  Xxh64 h(seed);
  h.update(data, size);
  return h.digest();
}

}  // namespace troupe::checkpoint
