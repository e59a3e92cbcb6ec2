#include <gtest/gtest.h>

#include <cmath>

#include "../../tensor/src/philox.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::tensor;

TEST(Philox, MatchesTheRandom123KnownAnswers) {
  // Known-answer vectors from Random123's kat_vectors for philox4x32_10.
  const auto zero = tensor::detail::philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zero.w[0], 0x6627e8d5u);
  EXPECT_EQ(zero.w[1], 0xe169c58du);
  EXPECT_EQ(zero.w[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.w[3], 0x9b00dbd8u);
  const auto ones = tensor::detail::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(ones.w[0], 0x408f276du);
  EXPECT_EQ(ones.w[1], 0x41c83b0eu);
  EXPECT_EQ(ones.w[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.w[3], 0x6d5451fdu);
}

TEST(Generator, SameSeedGivesTheSameTensor) {
  Generator a(42), b(42);
  EXPECT_TRUE(equal(normal({1000}, 0, 1, a), normal({1000}, 0, 1, b)));
  EXPECT_TRUE(equal(uniform({17}, -1, 1, a), uniform({17}, -1, 1, b)));
}

TEST(Generator, SuccessiveDrawsDifferAndAdvanceTheOffset) {
  Generator g(7);
  const Tensor x = uniform({10}, 0, 1, g);
  EXPECT_EQ(g.offset(), 3u);  // 10 words in blocks of 4
  const Tensor y = uniform({10}, 0, 1, g);
  EXPECT_FALSE(equal(x, y));
  Generator other(8);
  EXPECT_FALSE(equal(x, uniform({10}, 0, 1, other)));
}

TEST(Generator, RestoringTheStateReproducesTheDraw) {
  Generator g(3);
  uniform({5}, 0, 1, g);
  const auto seed = g.seed(), offset = g.offset();
  const Tensor expected = normal({33}, 2, 3, g, DType::f64);
  Generator restored;
  restored.set_state(seed, offset);
  EXPECT_TRUE(equal(expected, normal({33}, 2, 3, restored, DType::f64)));
}

TEST(Generator, ElementIDependsOnlyOnSeedOffsetAndI) {
  // A prefix of a longer draw equals a shorter draw: no hidden per-call state.
  Generator a(11), b(11);
  const Tensor longer = uniform({100}, 0, 1, a);
  const Tensor shorter = uniform({37}, 0, 1, b);
  EXPECT_TRUE(equal(longer.slice(0, 37), shorter));
}

TEST(Uniform, StaysInRangeWithTheRightMean) {
  Generator g(1);
  const Tensor u = uniform({100000}, -2, 3, g, DType::f64);
  EXPECT_GE(min(u).item(), -2.0);
  EXPECT_LT(max(u).item(), 3.0);
  EXPECT_NEAR(mean(u).item(), 0.5, 0.02);
}

TEST(Normal, HasTheRequestedMeanAndStandardDeviation) {
  Generator g(2);
  const Tensor z = normal({200000}, 1.5, 2.0, g, DType::f64);
  const double m = mean(z).item();
  const Tensor centered = add(z, -m);
  const double sd = norm(centered).item() / std::sqrt(200000.0);
  EXPECT_NEAR(m, 1.5, 0.02);
  EXPECT_NEAR(sd, 2.0, 0.02);
}

TEST(Normal, WorksForEveryFloatingDTypeAndRejectsIntegers) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    Generator g(5);
    const Tensor z = normal({64}, 0, 1, g, t);
    EXPECT_EQ(z.dtype(), t);
    Generator g32(5);
    EXPECT_TRUE(allclose(z.to(DType::f32), normal({64}, 0, 1, g32), 1e-2, 1e-2));
  }
  Generator g;
  EXPECT_THROW(normal({4}, 0, 1, g, DType::i32), InvalidArgument);
  EXPECT_THROW(normal({4}, 0, -1, g), InvalidArgument);
}
