// XXH64 (Yann Collet's xxHash, 64-bit variant), the checksum stored on every dataset of
// a checkpoint. Written here rather than pulled in as a dependency because it is ~100
// lines and the file format must not depend on a library version; it is checked against
// the published test vectors in tests/checkpoint/xxhash64_test.cpp.
//
// Xxh64 is streaming: update() in pieces of any size gives the same digest as one call
// over the whole buffer, which lets a writer hash a tensor as it goes out.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::checkpoint {

class Xxh64 {
 public:
  explicit Xxh64(std::uint64_t seed = 0);
  void update(const void* data, std::size_t size);
  std::uint64_t digest() const;

 private:
  std::uint64_t v_[4];
  std::uint64_t seed_;
  std::uint64_t total_ = 0;
  unsigned char buffer_[32];
  std::size_t buffered_ = 0;
};

// One-shot form.
std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed = 0);

}  // namespace troupe::checkpoint
