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

Xxh64::Xxh64(std::uint64_t seed) : seed_(seed) {
  v_[0] = seed + kP1 + kP2;
  v_[1] = seed + kP2;
  v_[2] = seed;
  v_[3] = seed - kP1;
}

void Xxh64::update(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += size;
  if (buffered_ + size < 32) {
    if (size) std::memcpy(buffer_ + buffered_, p, size);
    buffered_ += size;
    return;
  }
  if (buffered_) {
    std::size_t fill = 32 - buffered_;
    std::memcpy(buffer_ + buffered_, p, fill);
    for (int i = 0; i < 4; ++i) v_[i] = round(v_[i], read64(buffer_ + 8 * i));
    p += fill;
    size -= fill;
    buffered_ = 0;
  }
  // The hot loop: four independent lanes so the multiplies pipeline.
  std::uint64_t a = v_[0], b = v_[1], c = v_[2], d = v_[3];
  while (size >= 32) {
    a = round(a, read64(p));
    b = round(b, read64(p + 8));
    c = round(c, read64(p + 16));
    d = round(d, read64(p + 24));
    p += 32;
    size -= 32;
  }
  v_[0] = a, v_[1] = b, v_[2] = c, v_[3] = d;
  if (size) std::memcpy(buffer_, p, size);
  buffered_ = size;
}

std::uint64_t Xxh64::digest() const {
  std::uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, v_[i]);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const unsigned char* p = buffer_;
  std::size_t left = buffered_;
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
