// Activation checkpointing (module.hpp): recomputing a module's forward in its
// backward gives the same numbers, bit for bit, for less memory. And the activation
// stash: several forwards in flight through one module, each backward reading its own.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "token_ids.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/tensor/host_memory.hpp"

using namespace troupe;
using namespace troupe::nn;
using nn::testing::token_ids;
using tensor::DType;

namespace {

struct Training {
  std::vector<double> losses;
  std::vector<std::string> ready;  // grad-ready order of the last step
  std::uint64_t hash = 0;
};

// A few AdamW steps of a GPT with dropout, blocks checkpointed every `every`.
Training train_gpt(std::int64_t every, int steps = 3) {
  const GPTConfig config{.block_size = 8, .vocab_size = 11, .n_layer = 3, .n_head = 2, .n_embd = 16, .dropout = 0.2};
  GPT model(config, 21);
  model.checkpoint_blocks(every);
  AdamW opt(model.named_parameters(), 1e-2, {0.9, 0.95}, 1e-8, 0.1);
  CrossEntropyLoss loss;
  Training run;
  model.set_grad_ready_hook([&](const std::string& name, Parameter&) { run.ready.push_back(name); });
  for (int step = 0; step < steps; ++step) {
    run.ready.clear();
    run.losses.push_back(
        loss.forward(model.forward(token_ids(4, 8, 11, 100 + step)), token_ids(4, 8, 11, 200 + step)).item());
    opt.zero_grad();
    model.backward(loss.backward());
    opt.step();
  }
  run.hash = parameter_hash(model);
  return run;
}

// Peak host bytes a forward and backward of `model` add over what was live before.
std::size_t activation_peak(GPT& model, const Tensor& ids, const Tensor& targets) {
  CrossEntropyLoss loss;
  model.zero_grad();
  loss.forward(model.forward(ids), targets);  // grads allocated, caches warm
  model.backward(loss.backward());
  model.release_activations();
  const std::size_t before = tensor::host_memory_stats().live_bytes;
  tensor::reset_host_memory_peak();
  loss.forward(model.forward(ids), targets);
  model.backward(loss.backward());
  return tensor::host_memory_stats().peak_bytes - before;
}

}  // namespace

TEST(ActivationCheckpointing, GptTrainsBitForBitAsWithout) {
  const Training plain = train_gpt(0);
  for (std::int64_t every : {1, 2}) {
    SCOPED_TRACE("every " + std::to_string(every));
    const Training recomputed = train_gpt(every);
    EXPECT_EQ(recomputed.losses, plain.losses);  // exact: dropout masks drawn again alike
    EXPECT_EQ(recomputed.hash, plain.hash);
    EXPECT_EQ(recomputed.ready, plain.ready);  // DDP's buckets see the same order
  }
}

TEST(ActivationCheckpointing, DropoutGeneratorsEndWhereTheyWouldWithout) {
  const GPTConfig config{.block_size = 8, .vocab_size = 11, .n_layer = 2, .n_head = 2, .n_embd = 16, .dropout = 0.3};
  GPT plain(config, 3), recomputed(config, 3);
  recomputed.checkpoint_blocks(1);
  CrossEntropyLoss loss;
  for (GPT* model : {&plain, &recomputed}) {
    loss.forward(model->forward(token_ids(2, 8, 11, 1)), token_ids(2, 8, 11, 2));
    model->backward(loss.backward());
  }
  // A second forward after the step draws the same masks only if the streams agree.
  const Tensor a = plain.forward(token_ids(2, 8, 11, 3)), b = recomputed.forward(token_ids(2, 8, 11, 3));
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
}

TEST(ActivationCheckpointing, AnyModuleTreeRecomputesItsForward) {
  tensor::Generator gen(7);
  auto make = [&gen] {
    auto model = std::make_shared<Sequential>();
    model->emplace<Linear>(6, 12, gen);
    model->emplace<GELU>();
    model->emplace<Linear>(12, 3, gen);
    return model;
  };
  const auto plain = make();
  gen = tensor::Generator(7);
  const auto recomputed = make();
  recomputed->set_activation_checkpointing(true);
  EXPECT_TRUE(recomputed->activation_checkpointing());
  const Tensor x = tensor::normal({5, 6}, 0, 1, gen), gy = tensor::normal({5, 3}, 0, 1, gen);
  EXPECT_EQ(plain->forward(x).to_vector<float>(), recomputed->forward(x).to_vector<float>());
  EXPECT_EQ(plain->backward(gy).to_vector<float>(), recomputed->backward(gy).to_vector<float>());
  const auto p = plain->named_parameters(), r = recomputed->named_parameters();
  for (std::size_t i = 0; i < p.size(); ++i)
    EXPECT_EQ(p[i].param->grad.to_vector<float>(), r[i].param->grad.to_vector<float>()) << p[i].name;
}

TEST(ActivationCheckpointing, EvalModeKeepsTheCaches) {
  tensor::Generator gen(1);
  Linear layer(4, 2, gen);
  layer.set_activation_checkpointing(true);
  layer.eval();
  const Tensor x = tensor::normal({3, 4}, 0, 1, gen);
  layer.forward(x);
  EXPECT_NO_THROW(layer.backward(tensor::normal({3, 2}, 0, 1, gen)));
}

TEST(ActivationCheckpointing, ABackwardAfterReleasedActivationsIsAnError) {
  tensor::Generator gen(1);
  Linear layer(4, 2, gen);
  layer.forward(tensor::normal({3, 4}, 0, 1, gen));
  layer.release_activations();
  EXPECT_THROW(layer.backward(tensor::normal({3, 2}, 0, 1, gen)), InvalidArgument);
}

TEST(ActivationCheckpointing, KeepsLessThanHalfTheActivations) {
  const GPTConfig config{.block_size = 32, .vocab_size = 16, .n_layer = 8, .n_head = 4, .n_embd = 64};
  GPT plain(config, 5), recomputed(config, 5);
  recomputed.checkpoint_blocks(1);
  const Tensor ids = token_ids(8, 32, 16, 4), targets = token_ids(8, 32, 16, 5);
  const std::size_t full = activation_peak(plain, ids, targets);
  const std::size_t kept = activation_peak(recomputed, ids, targets);
  // About one block's activations plus each block's input, against all blocks'.
  EXPECT_LT(static_cast<double>(kept), 0.5 * static_cast<double>(full)) << kept << " of " << full << " bytes";
  EXPECT_GT(kept, 0U);
}

// A Linear that counts the products it computes.
class CountingLinear : public Linear {
 public:
  CountingLinear(std::int64_t in, std::int64_t out, tensor::Generator& gen, bool bias, int& products)
      : Linear(in, out, gen, bias), products_(products) {}
  Tensor forward_impl(const Tensor& input) override {
    ++products_;
    return Linear::forward_impl(input);
  }

 private:
  int& products_;
};

// The recompute leaves out what no backward reads: a block's output, and with it the
// MLP's c_proj, whose output only the block's residual sum (and dropout) take.
TEST(ActivationCheckpointing, TheRecomputeDoesNotRunTheMlpsLastLinear) {
  int c_fc = 0, c_proj = 0;
  GPTParts parts;
  parts.mlp_c_fc = [&](std::int64_t in, std::int64_t out, tensor::Generator& gen, bool bias, DType, tensor::Device) {
    return std::make_shared<CountingLinear>(in, out, gen, bias, c_fc);
  };
  parts.mlp_c_proj = [&](std::int64_t in, std::int64_t out, tensor::Generator& gen, bool bias, DType, tensor::Device) {
    return std::make_shared<CountingLinear>(in, out, gen, bias, c_proj);
  };
  const GPTConfig config{.block_size = 8, .vocab_size = 11, .n_layer = 3, .n_head = 2, .n_embd = 16, .dropout = 0.2};
  GPT model(config, 21, DType::f32, tensor::Device::cpu(), parts);
  model.checkpoint_blocks(1);
  CrossEntropyLoss loss;
  loss.forward(model.forward(token_ids(4, 8, 11, 1)), token_ids(4, 8, 11, 2));
  model.backward(loss.backward());
  EXPECT_EQ(c_fc, 6);    // forward and recompute, 3 blocks
  EXPECT_EQ(c_proj, 3);  // forward only
}

// Three forwards in flight through one GPT (a pipeline stage's micro-batches), each
// one's caches taken out and put back before its backward: the same losses, and the
// same gradients after each backward, bit for bit, as three forward-backward pairs in a
// row; with blocks checkpointed too (their kept inputs travel in the stash).
TEST(ActivationStash, ForwardsInFlightEachBackwardReadsItsOwn) {
  const GPTConfig config{.block_size = 8, .vocab_size = 11, .n_layer = 2, .n_head = 2, .n_embd = 16, .dropout = 0.2};
  const auto gradients = [](GPT& model) {
    std::vector<std::vector<float>> out;
    for (Parameter* p : model.parameters()) out.push_back(p->grad.to_vector<float>());
    return out;
  };
  for (const std::int64_t every : {0, 1}) {
    SCOPED_TRACE("checkpoint every " + std::to_string(every));
    GPT in_turn(config, 4), in_flight(config, 4);
    in_flight.checkpoint_blocks(every);
    std::vector<CrossEntropyLoss> a(3), b(3);
    std::vector<double> la, lb;
    std::vector<std::vector<std::vector<float>>> ga, gb;  // after each backward
    for (int i = 0; i < 3; ++i) {
      la.push_back(a[i].forward(in_turn.forward(token_ids(2, 8, 11, 10 + i)), token_ids(2, 8, 11, 20 + i)).item());
      in_turn.backward(a[i].backward());
      ga.push_back(gradients(in_turn));
    }
    std::vector<ActivationStash> stashes;
    for (int i = 0; i < 3; ++i) {
      lb.push_back(b[i].forward(in_flight.forward(token_ids(2, 8, 11, 10 + i)), token_ids(2, 8, 11, 20 + i)).item());
      stashes.push_back(in_flight.take_activations());
    }
    // Nothing cached is left behind: a backward now has no forward.
    EXPECT_THROW(in_flight.backward(b[0].backward()), InvalidArgument);
    for (int i = 0; i < 3; ++i) {
      in_flight.restore_activations(std::move(stashes[static_cast<std::size_t>(i)]));
      in_flight.backward(b[i].backward());
      gb.push_back(gradients(in_flight));
    }
    EXPECT_EQ(la, lb);
    EXPECT_TRUE(ga == gb);
  }
}

TEST(ActivationStash, AStashGoesBackOnceAndOnlyWhereItCameFrom) {
  tensor::Generator gen(2);
  Linear layer(4, 2, gen);
  GPT gpt({.block_size = 4, .vocab_size = 5, .n_layer = 1, .n_head = 1, .n_embd = 4}, 1);
  layer.forward(tensor::normal({3, 4}, 0, 1, gen));
  ActivationStash stash = layer.take_activations();
  EXPECT_THROW(gpt.restore_activations(std::move(stash)), InvalidArgument);  // another tree
  layer.forward(tensor::normal({3, 4}, 0, 1, gen));
  ActivationStash again = layer.take_activations();
  layer.restore_activations(std::move(again));
  EXPECT_THROW(layer.restore_activations(std::move(again)), InvalidArgument);  // NOLINT: restored already
  EXPECT_NO_THROW(layer.backward(tensor::normal({3, 2}, 0, 1, gen)));
}

TEST(ActivationCheckpointing, ANegativeFrequencyIsAnError) {
  GPT model({.block_size = 4, .vocab_size = 5, .n_layer = 1, .n_head = 1, .n_embd = 4}, 1);
  EXPECT_THROW(model.checkpoint_blocks(-1), InvalidArgument);
}
