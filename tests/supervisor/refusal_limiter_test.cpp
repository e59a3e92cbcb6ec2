// RefusalLimiter: a flood of refused connections becomes a few lines and a count.
#include <gtest/gtest.h>

#include "refusal_limiter.hpp"

namespace sv = troupe::supervisor;
using namespace std::chrono_literals;

namespace {

sv::Refusal from(const std::string& address, sv::RefusalKind kind = sv::RefusalKind::silent) {
  return sv::Refusal{address + ":1234", address, kind, "no hello within 2 s"};
}

}  // namespace

TEST(RefusalLimiter, LetsTheFirstFewThroughAndCountsTheRestByKind) {
  sv::RefusalLimiter limiter(1s, 5, 5);
  const auto t0 = sv::Clock::now();
  int admitted = 0;
  for (int i = 0; i < 100; ++i)
    admitted +=
        limiter.admit(t0 + i * 1ms, from("10.0.0.1", i % 2 ? sv::RefusalKind::evicted : sv::RefusalKind::silent));
  EXPECT_EQ(admitted, 5);
  EXPECT_EQ(limiter.held(), 95u);
  EXPECT_FALSE(limiter.end_window(t0 + 500ms)) << "the window is not over yet";
  auto held = limiter.end_window(t0 + 1s);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->count, 95u);
  EXPECT_EQ(held->reasons(), "silent 47, evicted 48");
  EXPECT_EQ(held->reasons_json(), "{\"silent\": 47, \"evicted\": 48}");
  EXPECT_EQ(held->span, 1s);
  EXPECT_TRUE(limiter.admit(t0 + 2s, from("10.0.0.1"))) << "a new window lets refusals through again";
}

TEST(RefusalLimiter, HoldsAPeerPastItsShareWhileOthersStillGetThrough) {
  sv::RefusalLimiter limiter(10s, 20, 5);
  const auto t0 = sv::Clock::now();
  int noisy = 0;
  for (int i = 0; i < 50; ++i) noisy += limiter.admit(t0, from("10.0.0.1"));
  EXPECT_EQ(noisy, 5);
  EXPECT_TRUE(limiter.admit(t0, from("10.0.0.2")));
  for (int host = 3; host < 30; ++host) limiter.admit(t0, from("10.0.0." + std::to_string(host)));
  EXPECT_FALSE(limiter.admit(t0, from("10.0.0.99"))) << "20 in all per window";
  EXPECT_EQ(limiter.held(), 45u + 13u + 1u);
}

TEST(RefusalLimiter, AWindowThatHeldNothingBackReportsNothing) {
  sv::RefusalLimiter limiter(1s, 5, 5);
  const auto t0 = sv::Clock::now();
  EXPECT_TRUE(limiter.admit(t0, from("10.0.0.1")));
  EXPECT_FALSE(limiter.end_window(t0 + 2s));
  EXPECT_FALSE(limiter.end_window(t0 + 3s, true));
}

TEST(RefusalLimiter, ForceEndsAWindowEarlyWithWhatItHeld) {
  sv::RefusalLimiter limiter(10s, 1, 1);
  const auto t0 = sv::Clock::now();
  limiter.admit(t0, from("10.0.0.1"));
  limiter.admit(t0, from("10.0.0.1", sv::RefusalKind::protocol));
  auto held = limiter.end_window(t0 + 1s, true);
  ASSERT_TRUE(held);
  EXPECT_EQ(held->count, 1u);
  EXPECT_EQ(held->reasons(), "protocol 1");
}
