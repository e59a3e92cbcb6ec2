// The shared-memory slot writer's copies (collectives/src/slot_writer.hpp): whichever
// stores it picks, the slot holds exactly the data, and nothing around it changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "slot_writer.hpp"

namespace {

using troupe::collectives::detail::copy_streaming;
using troupe::collectives::detail::SlotWriter;

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<std::byte>(x >> 24);
  }
  return v;
}

TEST(SlotWriter, StreamingCopiesAreExactAtEveryAlignmentAndLength) {
  constexpr std::size_t kGuard = 64;
  for (std::size_t length :
       {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{63},
        std::size_t{64}, std::size_t{65}, std::size_t{1000}, std::size_t{(64 << 10) + 13}}) {
    for (std::size_t dst_offset = 0; dst_offset < 20; dst_offset += 3) {
      for (std::size_t src_offset : {std::size_t{0}, std::size_t{5}}) {
        const auto src = pattern(length + src_offset, static_cast<unsigned>(length));
        auto dst = pattern(length + dst_offset + 2 * kGuard, 7);
        const auto before = dst;
        copy_streaming(dst.data() + kGuard + dst_offset, src.data() + src_offset, length);
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= kGuard + dst_offset && i < kGuard + dst_offset + length;
          const std::byte want = inside ? src[src_offset + i - kGuard - dst_offset] : before[i];
          ASSERT_EQ(dst[i], want) << "length " << length << ", dst offset " << dst_offset << ", src offset "
                                  << src_offset << ", byte " << i << (inside ? "" : " (outside the copy)");
        }
      }
    }
  }
}

TEST(SlotWriter, EveryCopyIsExactWhicheverKindOfStoresItPicks) {
  // Enough large copies that the writer measures both kinds and explores the one it
  // is not using several times; sizes either side of the timed threshold.
  SlotWriter writer;
  std::vector<std::byte> slot((256 << 10) + 64);
  for (unsigned i = 0; i < 4 * SlotWriter::kExploreEvery; ++i) {
    const std::size_t length = i % 3 == 0 ? SlotWriter::kTimedBytes - 1 : (256 << 10) - 16 * (i % 5);
    const auto data = pattern(length, i);
    writer.copy(slot.data() + i % 4, data.data(), length);
    ASSERT_TRUE(std::equal(data.begin(), data.end(), slot.begin() + i % 4))
        << "copy " << i << " of " << length << " bytes";
  }
}

}  // namespace
