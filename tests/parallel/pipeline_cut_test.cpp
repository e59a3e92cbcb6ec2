// Where a GPT is cut into pipeline stages (parallel::balanced_cut, gpt_pipeline_cut):
// arithmetic alone, the same on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/parallel/pipeline.hpp"

namespace troupe::parallel {
namespace {

// The largest stage's parameters under a cut: the blocks' and the end stages' extras.
std::int64_t largest_stage(const std::vector<std::int64_t>& cut, const std::vector<std::int64_t>& sizes,
                           std::int64_t first_extra, std::int64_t last_extra) {
  std::int64_t largest = 0;
  const auto stages = static_cast<int>(cut.size()) - 1;
  for (int s = 0; s < stages; ++s) {
    std::int64_t load = (s == 0 ? first_extra : 0) + (s == stages - 1 ? last_extra : 0);
    for (auto i = cut[static_cast<std::size_t>(s)]; i < cut[static_cast<std::size_t>(s) + 1]; ++i)
      load += sizes[static_cast<std::size_t>(i)];
    largest = std::max(largest, load);
  }
  return largest;
}

// 8 blocks of 10 with 25 more on the first stage and 15 on the last: no stage can be
// below 35 (the first holds a block); of the cuts that reach it, 1, 3, 3, 1 is the most
// even (35, 30, 30, 25), where the uniform cut's first stage holds 45.
TEST(PipelineCut, EndStagesGiveWayToTheirExtras) {
  const std::vector<std::int64_t> sizes(8, 10);
  EXPECT_EQ(balanced_cut(sizes, 25, 15, 4), (std::vector<std::int64_t>{0, 1, 4, 7, 8}));
  EXPECT_EQ(balanced_cut(sizes, 0, 0, 4), (std::vector<std::int64_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(balanced_cut(sizes, 25, 15, 1), (std::vector<std::int64_t>{0, 8}));
  EXPECT_EQ(balanced_cut(sizes, 25, 15, 8), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  // Uneven blocks: the one large block stands alone.
  EXPECT_EQ(balanced_cut({5, 5, 40, 5, 5, 5}, 0, 0, 3), (std::vector<std::int64_t>{0, 2, 3, 6}));
}

// GPT-2 XL (48 blocks of 30.7M, a 50,257 x 1,600 table) at pp 8: the uniform cut's
// last stage holds 6 blocks and the table it steps (265M; the first stage counts the
// table at half, held without AdamW's moments); cut by parameters, no stage holds more
// than 7 blocks' worth (215M), the first and last stages fewer blocks.
TEST(PipelineCut, Gpt2XlAtEightStagesHoldsNoStageAboveSevenBlocks) {
  const nn::GPTConfig xl{.block_size = 1024, .vocab_size = 50257, .n_layer = 48, .n_head = 25, .n_embd = 1600};
  const std::vector<std::int64_t> cut = gpt_pipeline_cut(xl, 8),
                                  uniform = gpt_pipeline_cut(xl, 8, PipelineCut::uniform);
  EXPECT_EQ(uniform, (std::vector<std::int64_t>{0, 6, 12, 18, 24, 30, 36, 42, 48}));
  const std::int64_t block = 12 * 1600 * 1600 + 13 * 1600, table = 50257 * 1600;
  const std::vector<std::int64_t> sizes(48, block);
  const std::int64_t first = table / 2 + 1024 * 1600, last = table + 2 * 1600;
  EXPECT_EQ(largest_stage(uniform, sizes, first, last), 6 * block + last);
  EXPECT_EQ(largest_stage(cut, sizes, first, last), 7 * block);
  EXPECT_LT(cut[1], 6);
  EXPECT_GT(cut[7], 42);
}

TEST(PipelineCut, BadRequestsAreRefused) {
  EXPECT_EQ(parse_pipeline_cut("uniform"), PipelineCut::uniform);
  EXPECT_STREQ(pipeline_cut_name(parse_pipeline_cut("parameters")), "parameters");
  EXPECT_THROW(parse_pipeline_cut("even"), InvalidArgument);
  EXPECT_THROW(balanced_cut({1, 2}, 0, 0, 3), InvalidArgument);
  EXPECT_THROW(balanced_cut({1, -2}, 0, 0, 2), InvalidArgument);
  const nn::GPTConfig small{.block_size = 8, .vocab_size = 10, .n_layer = 2, .n_head = 1, .n_embd = 4};
  EXPECT_THROW(gpt_pipeline_cut(small, 3), InvalidArgument);
}

}  // namespace
}  // namespace troupe::parallel
