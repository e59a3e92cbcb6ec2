// XXH64 (Yann Collet's xxHash, 64-bit variant), the checksum stored on every dataset of
// a checkpoint. Written here rather than pulled in as a dependency because it is ~100
// lines and the file format must not depend on a library version; it is checked against
// the published test vectors in tests/checkpoint/xxhash64_test.cpp.
//
// Xxh64 is streaming: update() in pieces of any size gives the same digest as one call
// over the whole buffer, which lets a writer hash a tensor as it goes out. Its state is
// plain data (State): export it, send it to another process, resume there, and the
// digest is that of the two processes' bytes one after the other -- how the parallel
// save hashes a tensor whose pieces sit on different ranks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe::checkpoint {

class Xxh64 {
 public:
  // Everything the hash carries between updates: trivially copyable, so it can travel as
  // bytes between processes of the same architecture.
  struct State {
    std::uint64_t v[4];
    std::uint64_t seed;
    std::uint64_t total;
    std::uint64_t buffered;  // bytes waiting in buffer for a whole 32-byte stripe
    unsigned char buffer[32];
  };

  explicit Xxh64(std::uint64_t seed = 0);
  // Continues a hash whose state() was taken elsewhere.
  explicit Xxh64(const State& state) : state_(state) {}
  void update(const void* data, std::size_t size);
  std::uint64_t digest() const;
  const State& state() const { return state_; }

 private:
  State state_;
};

// One-shot form.
std::uint64_t xxh64(const void* data, std::size_t size, std::uint64_t seed = 0);

}  // namespace troupe::checkpoint
