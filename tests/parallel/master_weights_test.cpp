// MasterWeights: mixed precision keeps the updates that a bf16 parameter cannot hold.
#include <gtest/gtest.h>

#include "train_world.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/grad_scaler.hpp"
#include "troupe/parallel/master_weights.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::train {
namespace {

using testing::world;

TEST(MasterWeights, UpdatesBelowBf16SpacingAccumulateInTheMastersAndReachTheModel) {
  tensor::Generator gen(0);
  nn::Linear with_master(2, 2, gen, true, DType::bf16), plain(2, 2, gen, true, DType::bf16);
  for (nn::Linear* m : {&with_master, &plain}) m->weight().data.fill_(1.0);
  parallel::MasterWeights master(with_master);
  nn::SGD sgd_master(master.named_parameters(), 1.0), sgd_plain(plain.named_parameters(), 1.0);
  // 1e-3 is under half of bf16's spacing at 1.0 (2^-7): one step alone rounds away.
  for (int step = 0; step < 10; ++step) {
    with_master.weight().grad = Tensor::full({2, 2}, 1e-3, DType::bf16);
    plain.weight().grad = Tensor::full({2, 2}, 1e-3, DType::bf16);
    master.copy_gradients_to_master();
    sgd_master.step();
    master.copy_master_to_model();
    sgd_plain.step();
  }
  EXPECT_EQ(plain.weight().data.to_vector<float>()[0], 1.0f) << "pure bf16 loses every update";
  EXPECT_NEAR(master.named_parameters()[0].param->data.to_vector<float>()[0], 0.99, 1e-4);
  EXPECT_EQ(with_master.weight().data.to_vector<float>()[0], 0.98828125f)
      << "0.99 rounded to bf16 (spacing 2^-8 below 1)";
}

// A tied table is in a state dict under two names: both carry the f32 master, and an
// f32 dict (an f32 run's checkpoint, or PyTorch's) loads into the bf16 model under both.
TEST(MasterWeights, ATiedTableIsF32UnderBothNamesAndLoadsFromAnF32Dict) {
  const nn::GPTConfig config{.block_size = 8, .vocab_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 8};
  nn::GPT f32_model(config, 3), model(config, 4);
  model.to(DType::bf16);
  parallel::MasterWeights master(model);
  const nn::StateDict want = f32_model.state_dict();
  master.load_state_dict(model, want);  // threw: lm_head.weight f32 against the bf16 model
  const nn::StateDict got = master.state_dict(model);
  for (const char* name : {"transformer.wte.weight", "lm_head.weight"}) {
    EXPECT_EQ(got.at(name).dtype(), DType::f32) << name;
    EXPECT_EQ(got.at(name).to_vector<float>(), want.at(name).to_vector<float>()) << name;
  }
  EXPECT_EQ(model.state_dict().at("lm_head.weight").dtype(), DType::bf16);
}

TEST(MasterWeights, Bf16DataParallelTrainingWithScalingAndAccumulationTracksTheF32Run) {
  auto& comm = world();
  const TensorDataset data = testing::make_data(8 * 40, 31 + static_cast<std::uint64_t>(comm.rank()));
  nn::CrossEntropyLoss loss_fn;
  auto run = [&](bool bf16) {
    auto model = testing::make_mlp(4);
    if (bf16) model->to(DType::bf16);
    parallel::DistributedDataParallel ddp(*model, comm);
    std::unique_ptr<parallel::MasterWeights> master =
        bf16 ? std::make_unique<parallel::MasterWeights>(*model) : nullptr;
    nn::SGD sgd(bf16 ? master->named_parameters() : model->named_parameters(), 0.1, 0.9);
    parallel::GradScaler scaler(&comm);
    for (std::int64_t k = 0; k < 40; ++k) {
      std::vector<std::int64_t> idx;
      for (std::int64_t i = 0; i < 8; ++i) idx.push_back(8 * k + i);
      const TensorBatch batch = data.rows(idx);
      loss_fn.forward(ddp.forward(bf16 ? batch.inputs.to(DType::bf16) : batch.inputs), batch.targets);
      ddp.optimizer_step_with_gradient_accumulation(sgd, [&](double s) { return loss_fn.backward(s); }, 2, 40,
                                                    {.max_grad_norm = 5.0, .scaler = &scaler, .master = master.get()});
    }
    EXPECT_TRUE(testing::same_on_every_rank(testing::parameter_hash(*model)));
    EXPECT_EQ(scaler.skipped_steps(), 0);
    return testing::flat_parameters(*model);
  };
  const auto reference = run(false), mixed = run(true);
  ASSERT_EQ(reference.size(), mixed.size());
  double worst = 0;
  for (std::size_t i = 0; i < reference.size(); ++i) worst = std::max(worst, std::abs(reference[i] - mixed[i]));
  EXPECT_LT(worst, 2e-2) << "bf16 compute with f32 masters should stay within bf16 rounding of the f32 run";
  EXPECT_GT(worst, 0) << "and it is really bf16";
}

}  // namespace
}  // namespace troupe::train
