// GradScaler: the inf/NaN verdict is agreed by all ranks, so an overflow on one rank
// skips the step on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "train_world.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/grad_scaler.hpp"

namespace troupe::train {
namespace {

using testing::world;

TEST(GradScaler, SkipsExactlyTheStepsWithAnOverflowOnAnyRankOnEveryRank) {
  auto& comm = world();
  auto model = testing::make_mlp(1);
  nn::SGD sgd(model->named_parameters(), 0.1);
  parallel::GradScaler scaler(&comm, {.init_scale = 1024, .growth_interval = 1000});
  nn::CrossEntropyLoss loss_fn;
  const TensorDataset data = testing::make_data(16, 5 + static_cast<std::uint64_t>(comm.rank()));
  const int bad_rank = comm.size() - 1;
  std::vector<bool> stepped;
  for (int step = 0; step < 6; ++step) {
    sgd.zero_grad();
    loss_fn.forward(model->forward(data.inputs), data.targets);
    model->backward(loss_fn.backward(scaler.scale()));
    // Steps 2 and 4 overflow on the last rank only (NaN, then inf).
    if (comm.rank() == bad_rank && (step == 2 || step == 4)) {
      auto* p = model->named_parameters()[3].param->grad.data<float>();
      p[0] = step == 2 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    }
    const std::uint64_t before = testing::parameter_hash(*model);
    const bool did = scaler.step(sgd);
    EXPECT_EQ(did, testing::parameter_hash(*model) != before);
    stepped.push_back(did);
    scaler.update();
  }
  EXPECT_EQ(stepped, (std::vector<bool>{true, true, false, true, false, true}));
  EXPECT_DOUBLE_EQ(scaler.scale(), 256.0) << "two backoffs of 0.5 from 1024";
  EXPECT_EQ(scaler.skipped_steps(), 2);
}

TEST(GradScaler, UnscalesToTheTrueGradientAndGrowsAfterTheIntervalOfGoodSteps) {
  auto model = testing::make_mlp(2), plain = testing::make_mlp(2);
  nn::SGD sgd(model->named_parameters(), 0.1);
  parallel::GradScaler scaler(&world(), {.init_scale = 65536, .growth_interval = 3});
  EXPECT_DOUBLE_EQ(parallel::GradScaler(nullptr).scale(), 65536.0) << "the default initial scale is 2^16";
  nn::CrossEntropyLoss loss_fn;
  const TensorDataset data = testing::make_data(16, 6);
  loss_fn.forward(model->forward(data.inputs), data.targets);
  model->backward(loss_fn.backward(scaler.scale()));
  loss_fn.forward(plain->forward(data.inputs), data.targets);
  plain->backward(loss_fn.backward());
  EXPECT_FALSE(scaler.unscale_(sgd));
  EXPECT_THROW(scaler.unscale_(sgd), InvalidArgument) << "twice in one step would divide twice";
  for (std::size_t i = 0; i < 6; ++i) {
    const auto got = model->named_parameters()[i].param->grad.to_vector<double>();
    const auto want = plain->named_parameters()[i].param->grad.to_vector<double>();
    EXPECT_LE(testing::max_relative_difference(got, want), 1e-6);
  }
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(scaler.step(sgd));
    scaler.update();
  }
  EXPECT_DOUBLE_EQ(scaler.scale(), 131072.0) << "grows by 2 after 3 good steps";
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, CudaGradientsAreUnscaledAndCheckedByTheFusedKernel) {
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const Device gpu = Device::cuda();
  nn::Parameter a{Tensor::zeros({3}, DType::f32, gpu), Tensor::from_vector<float>({2, 4, 8}, {}, gpu)};
  nn::Parameter b{Tensor::zeros({2}, DType::f32, gpu), Tensor::from_vector<float>({16, 32}, {}, gpu)};
  nn::SGD sgd({{"a", &a}, {"b", &b}}, 0.1);
  parallel::GradScaler scaler(nullptr, {.init_scale = 2});
  EXPECT_FALSE(scaler.unscale_(sgd));
  EXPECT_EQ(a.grad.to_vector<float>(), (std::vector<float>{1, 2, 4}));
  EXPECT_EQ(b.grad.to_vector<float>(), (std::vector<float>{8, 16}));
  scaler.update();
  b.grad = Tensor::from_vector<float>({1, std::numeric_limits<float>::infinity()}, {}, gpu);
  EXPECT_TRUE(scaler.unscale_(sgd)) << "an Inf in the second of two CUDA gradients";
}

TEST(GradScaler, StateDictRoundTripsScaleAndTracker) {
  parallel::GradScaler a(nullptr, {.init_scale = 8, .growth_interval = 5});
  nn::SGD sgd(std::vector<nn::NamedParameter>{}, 0.1);
  a.step(sgd);
  a.update();
  a.step(sgd);
  a.update();
  parallel::GradScaler b(nullptr);
  b.load_state_dict(a.state_dict());
  EXPECT_DOUBLE_EQ(b.scale(), 8.0);
  EXPECT_EQ(b.growth_tracker(), 2);
  EXPECT_EQ(b.options().growth_interval, 5);
}

TEST(GradScaler, WithAccumulationEveryRankSkipsTheOverflowingWindow) {
  auto& comm = world();
  auto model = testing::make_mlp(3);
  parallel::DistributedDataParallel ddp(*model, comm);
  nn::SGD sgd(model->named_parameters(), 0.1);
  parallel::GradScaler scaler(&comm, {.init_scale = 4096});
  nn::CrossEntropyLoss loss_fn;
  const TensorDataset data = testing::make_data(8, 9 + static_cast<std::uint64_t>(comm.rank()));
  int steps = 0, skipped = 0;
  for (int micro = 0; micro < 8; ++micro) {
    loss_fn.forward(ddp.forward(data.inputs), data.targets);
    const auto r = ddp.optimizer_step_with_gradient_accumulation(sgd,
                                                                 [&](double scale) {
                                                                   Tensor g = loss_fn.backward(scale);
                                                                   // The second window's first micro-batch overflows on
                                                                   // rank 0 only.
                                                                   if (micro == 2 && comm.rank() == 0)
                                                                     g.data<float>()[0] =
                                                                         std::numeric_limits<float>::infinity();
                                                                   return g;
                                                                 },
                                                                 2, 8, {.max_grad_norm = 1.0, .scaler = &scaler});
    steps += r.stepped;
    skipped += r.skipped;
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(skipped, 1);
  EXPECT_DOUBLE_EQ(scaler.scale(), 2048.0);
  EXPECT_TRUE(testing::same_on_every_rank(testing::parameter_hash(*model)));
}

}  // namespace
}  // namespace troupe::train
