#include "troupe/checkpoint/xxhash64.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace troupe::checkpoint {
namespace {

std::uint64_t hash(const std::string& s, std::uint64_t seed = 0) { return xxh64(s.data(), s.size(), seed); }

// Published values: the empty input from xxHash's own sanity checks (xxhsum of an empty
// file), the others from the python-xxhash README and xxHash's reference outputs.
TEST(Xxh64, MatchesPublishedTestVectors) {
  EXPECT_EQ(hash(""), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(hash("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(hash("abc"), 0x44BC2CF5AD770999ULL);
  EXPECT_EQ(hash("Nobody inspects the spammish repetition"), 0xFBCEA83C8A378BF1ULL);
  EXPECT_EQ(hash("xxhash", 20141025), 0xB559B98D844E0635ULL);
}

TEST(Xxh64, StreamingInAnyPiecesEqualsOneShot) {
  std::vector<unsigned char> data(1000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  for (std::size_t size : {0u, 1u, 3u, 31u, 32u, 33u, 64u, 100u, 1000u}) {
    std::uint64_t whole = xxh64(data.data(), size, 42);
    for (std::size_t piece : {1u, 5u, 17u, 32u, 33u}) {
      Xxh64 h(42);
      for (std::size_t at = 0; at < size; at += piece) h.update(data.data() + at, std::min(piece, size - at));
      EXPECT_EQ(h.digest(), whole) << "size " << size << " piece " << piece;
    }
  }
}

// The parallel save's chain: each "rank" hashes its range, hands the state on as bytes.
TEST(Xxh64, StateCopiedAsBytesAndResumedEqualsOneShot) {
  std::vector<unsigned char> data(777);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 37 + 1);
  for (std::size_t cut : {0u, 1u, 31u, 32u, 45u, 500u, 777u}) {
    Xxh64 first;
    first.update(data.data(), cut);
    unsigned char wire[sizeof(Xxh64::State)];
    std::memcpy(wire, &first.state(), sizeof wire);
    Xxh64::State received;
    std::memcpy(&received, wire, sizeof received);
    Xxh64 second(received);
    second.update(data.data() + cut, data.size() - cut);
    EXPECT_EQ(second.digest(), xxh64(data.data(), data.size())) << "cut at " << cut;
  }
}

TEST(Xxh64, OneFlippedBitChangesTheDigest) {
  std::vector<unsigned char> data(4096, 0x5a);
  std::uint64_t before = xxh64(data.data(), data.size());
  data[1234] ^= 0x10;
  EXPECT_NE(xxh64(data.data(), data.size()), before);
}

}  // namespace
}  // namespace troupe::checkpoint
