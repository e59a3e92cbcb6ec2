// TokenWindows (a token stream's (B, T+1) windows) and the objectives TrainWorker uses.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "troupe/error.hpp"
#include "troupe/train/objective.hpp"
#include "troupe/train/token_windows.hpp"

namespace troupe::train {
namespace {

Tensor stream(std::int64_t n) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  return Tensor::from_vector(ids);
}

TEST(TokenWindows, TileTheStreamWithTargetsOneTokenAhead) {
  const TokenWindows windows(stream(20), 4);  // starts 0, 4, 8, 12 (16 would need token 20)
  EXPECT_EQ(windows.size(), 4);
  const TensorBatch batch = windows.rows({3, 0});
  EXPECT_EQ(batch.inputs.shape(), (tensor::Shape{2, 4}));
  EXPECT_EQ(batch.inputs.to_vector<std::int64_t>(), (std::vector<std::int64_t>{12, 13, 14, 15, 0, 1, 2, 3}));
  EXPECT_EQ(batch.targets.to_vector<std::int64_t>(), (std::vector<std::int64_t>{13, 14, 15, 16, 1, 2, 3, 4}));
  EXPECT_EQ(batch.size(), 2);
}

TEST(TokenWindows, OverlapWithAShorterStride) {
  const TokenWindows windows(stream(10), 4, 2);  // starts 0, 2, 4 (6 + 4 = 10 is past the last target)
  EXPECT_EQ(windows.size(), 3);
  EXPECT_EQ(windows.rows({2}).targets.to_vector<std::int64_t>(), (std::vector<std::int64_t>{5, 6, 7, 8}));
}

TEST(TokenWindows, RefuseAStreamShorterThanOneWindowAndBadIndices) {
  EXPECT_NO_THROW(TokenWindows(stream(5), 4));
  try {
    TokenWindows(stream(4), 4);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a block size of 4 needs at least 5 tokens, the stream has 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(TokenWindows(Tensor::from_vector(std::vector<float>{1, 2, 3}), 1), InvalidArgument);
  EXPECT_THROW(TokenWindows(stream(10), 0), InvalidArgument);
  EXPECT_THROW(TokenWindows(stream(10), 4).rows({2}), InvalidArgument);
}

TEST(Objectives, CrossEntropyCountsCorrectSamplesAndMseReportsOnlyItsLoss) {
  CrossEntropyObjective ce;
  // Two rows over 3 classes: row 0's argmax is class 2 (right), row 1's class 0 (wrong).
  const Tensor logits = Tensor::from_vector(std::vector<float>{0, 1, 5, 3, 1, 0}, {2, 3});
  const Tensor labels = Tensor::from_vector(std::vector<std::int64_t>{2, 1});
  EXPECT_GT(ce.forward(logits, labels), 0);
  MetricSums sums;
  ce.add_metrics(logits, labels, 2, sums);
  EXPECT_DOUBLE_EQ(sums.at("correct"), 1.0);
  EXPECT_EQ(ce.backward(1.0).shape(), logits.shape());

  MSEObjective mse;
  const Tensor out = Tensor::from_vector(std::vector<float>{1, 2}),
               want = Tensor::from_vector(std::vector<float>{0, 0});
  EXPECT_DOUBLE_EQ(mse.forward(out, want), 2.5);
  MetricSums none;
  mse.add_metrics(out, want, 2, none);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(mse.backward(1.0).to_vector<float>(), (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace troupe::train
