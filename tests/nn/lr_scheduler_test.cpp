#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "troupe/nn/lr_scheduler.hpp"
#include "troupe/nn/sgd.hpp"

using namespace troupe;
using namespace troupe::nn;

namespace {

struct Fixture {
  Parameter p{Tensor::zeros({1}), Tensor()};
  SGD opt{{{"p", &p}}, 1.0};
};

}  // namespace

TEST(StepLR, MultipliesByGammaEveryStepSizeSteps) {
  Fixture f;
  StepLR schedule(f.opt, 3, 0.5);
  std::vector<double> seen{f.opt.lr()};
  for (int i = 0; i < 7; ++i) {
    schedule.step();
    seen.push_back(f.opt.lr());
  }
  EXPECT_EQ(seen, (std::vector<double>{1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25}));
  EXPECT_EQ(schedule.last_step(), 7);
  EXPECT_THROW(StepLR(f.opt, 0), InvalidArgument);
}

TEST(CosineWithWarmup, WarmsUpLinearlyThenFollowsHalfACosineToMinLr) {
  Fixture f;
  CosineWithWarmup schedule(f.opt, 4, 14, 0.1);
  EXPECT_EQ(f.opt.lr(), 0.0);  // step 0 of the warm-up
  EXPECT_DOUBLE_EQ(schedule.lr_at(1), 0.25);
  EXPECT_DOUBLE_EQ(schedule.lr_at(3), 0.75);
  EXPECT_DOUBLE_EQ(schedule.lr_at(4), 1.0);
  EXPECT_DOUBLE_EQ(schedule.lr_at(9), 0.1 + 0.9 * 0.5);  // half way: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(schedule.lr_at(6), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.2)));
  EXPECT_DOUBLE_EQ(schedule.lr_at(14), 0.1);
  EXPECT_DOUBLE_EQ(schedule.lr_at(100), 0.1);
  for (int i = 0; i < 9; ++i) schedule.step();
  EXPECT_DOUBLE_EQ(f.opt.lr(), 0.55);
  EXPECT_THROW(CosineWithWarmup(f.opt, 10, 10), InvalidArgument);
}

TEST(LRScheduler, StateDictResumesTheSchedule) {
  Fixture a, b;
  CosineWithWarmup first(a.opt, 2, 10);
  for (int i = 0; i < 5; ++i) first.step();
  b.opt.set_lr(123);  // the saved base lr, not the current one, must win
  CosineWithWarmup second(b.opt, 2, 10);
  second.load_state_dict(first.state_dict());
  EXPECT_EQ(second.last_step(), 5);
  EXPECT_EQ(second.base_lr(), 1.0);
  EXPECT_DOUBLE_EQ(b.opt.lr(), a.opt.lr());
  first.step();
  second.step();
  EXPECT_DOUBLE_EQ(b.opt.lr(), a.opt.lr());
}
