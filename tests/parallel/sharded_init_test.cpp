// Sharded construction (issue 25): a model described on the meta device and wrapped
// in FSDP is materialised shard by shard -- each rank computes only its own elements,
// nothing is broadcast -- and equals, bit for bit, the whole model built on the CPU
// and broadcast; construction then holds the shards, not the model.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "fsdp_harness.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/parallel/sharded_model.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/tensor/meta.hpp"

namespace troupe::train {
namespace {

using namespace fsdp_testing;
using testing::world;
using Strategy = parallel::FsdpOptions::ShardingStrategy;

std::unique_ptr<nn::Sequential> linear_stack(int layers, std::int64_t width, tensor::Device device) {
  tensor::Generator gen(13);
  auto model = std::make_unique<nn::Sequential>();
  for (int i = 0; i < layers; ++i) {
    model->emplace<nn::Linear>(width, width + i, gen, true, DType::f32, device);  // odd sizes: padded units
    model->emplace<nn::ReLU>();
    width += i;
  }
  return model;
}

nn::GPTConfig small_gpt() { return {.block_size = 16, .vocab_size = 37, .n_layer = 3, .n_head = 2, .n_embd = 24}; }

// This rank's pieces of every tensor, as the parallel save would write them.
void expect_same_pieces(parallel::FullyShardedDataParallel& want, parallel::FullyShardedDataParallel& got,
                        const char* what) {
  const auto a = want.local_model_slices(), b = got.local_model_slices();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].name, b[i].name) << what;
    ASSERT_EQ(a[i].begin, b[i].begin) << what << " " << a[i].name;
    ASSERT_EQ(a[i].data.defined(), b[i].data.defined()) << what << " " << a[i].name;
    if (!a[i].data.defined()) continue;
    const Tensor &x = a[i].data, &y = b[i].data;
    ASSERT_EQ(x.nbytes(), y.nbytes());
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0)
        << what << " rank " << world().rank() << " " << a[i].name;
  }
}

TEST(ShardedConstruction, MetaModelsShardToTheBitsOfTheBroadcastBuild) {
  for (Strategy strategy : {Strategy::full_shard, Strategy::shard_grad_op}) {
    const char* name = strategy == Strategy::full_shard ? "full_shard" : "shard_grad_op";
    {
      auto cpu = linear_stack(4, 33, tensor::Device::cpu());
      auto meta = linear_stack(4, 33, tensor::Device::meta());
      const parallel::FsdpOptions options{.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Linear>(),
                                          .sharding_strategy = strategy};
      parallel::FullyShardedDataParallel want(*cpu, world(), factory(Opt::adamw), options);
      parallel::FullyShardedDataParallel got(*meta, world(), factory(Opt::adamw), options);
      expect_same_pieces(want, got, name);
      EXPECT_EQ(got.full_state_dict().keys(), want.full_state_dict().keys());
    }
    {  // tied head, LayerNorm constants, GPT-2's re-initialisation over the constructors' draws
      nn::GPT cpu(small_gpt(), 21);
      nn::GPT meta(small_gpt(), 21, DType::f32, tensor::Device::meta());
      const parallel::FsdpOptions options{.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Block>(),
                                          .sharding_strategy = strategy};
      parallel::FullyShardedDataParallel want(cpu, world(), factory(Opt::adamw), options);
      parallel::FullyShardedDataParallel got(meta, world(), factory(Opt::adamw), options);
      expect_same_pieces(want, got, name);
      // The same training step from both.
      const Tensor idx = Tensor::from_vector<std::int64_t>({1, 5, 9, 2, 3, 36, 0, 7}, {2, 4});
      nn::CrossEntropyLoss loss_a, loss_b;
      const Tensor targets = Tensor::from_vector<std::int64_t>({5, 9, 2, 3, 36, 0, 7, 1}, {8});
      const double la = loss_a.forward(want.forward(idx).reshape({8, 37}), targets).item();
      const double lb = loss_b.forward(got.forward(idx).reshape({8, 37}), targets).item();
      EXPECT_EQ(la, lb) << name;
    }
  }
}

// The peak of live host bytes while the wrapper is built, above what was live before
// the model was: the shards (full_shard) or the unit buffers (shard_grad_op) alone
// from a meta model; at least the whole model from a CPU one.
TEST(ShardedConstruction, HoldsOnlyWhatTheModeKeeps) {
  constexpr int kLayers = 6;
  constexpr std::int64_t kWidth = 512;
  for (Strategy strategy : {Strategy::full_shard, Strategy::shard_grad_op}) {
    for (tensor::Device device : {tensor::Device::meta(), tensor::Device::cpu()}) {
      const auto live = tensor::host_memory_stats().live_bytes;
      tensor::reset_host_memory_peak();
      auto model = linear_stack(kLayers, kWidth, device);
      const double model_bytes = 4.0 * static_cast<double>(model->parameter_count());
      parallel::FullyShardedDataParallel f(
          *model, world(), factory(Opt::adamw),
          {.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Linear>(), .sharding_strategy = strategy});
      const double peak = static_cast<double>(tensor::host_memory_stats().peak_bytes - live);
      double kept = 0;  // what the mode keeps after construction
      for (const auto& path : f.unit_paths())
        kept += 4.0 * static_cast<double>(f.unit_padded_numel(path)) /
                (strategy == Strategy::full_shard ? static_cast<double>(world().size()) : 1.0);
      if (device.is_meta()) {
        EXPECT_LE(peak, 1.02 * kept + 65536) << "from meta, " << (strategy == Strategy::full_shard ? "fsdp" : "zero2");
      } else {
        EXPECT_GE(peak, model_bytes) << "the CPU build holds the whole model";
      }
      if (world().rank() == 0)
        std::printf("construction from %s, %s at %d ranks: peak %.2f MB, kept %.2f MB, model %.2f MB\n",
                    tensor::to_string(device).c_str(), strategy == Strategy::full_shard ? "fsdp" : "zero2",
                    world().size(), peak / 1e6, kept / 1e6, model_bytes / 1e6);
    }
  }
}

TEST(ShardedConstruction, Zero1MaterialisesTheWholeModelOnEveryRank) {
  auto cpu = linear_stack(3, 20, tensor::Device::cpu());
  auto meta = linear_stack(3, 20, tensor::Device::meta());
  parallel::ShardedModel a(parallel::Sharding::zero1, *cpu, world(), factory(Opt::adamw), 4096);
  parallel::ShardedModel b(parallel::Sharding::zero1, *meta, world(), factory(Opt::adamw), 4096);
  EXPECT_EQ(a.parameter_hash(), b.parameter_hash());
  for (const auto& named : meta->named_parameters()) EXPECT_FALSE(tensor::is_meta(named.param->data)) << named.name;
}

TEST(ShardedConstruction, AMetaTargetDeviceOrAnUndescribedTensorIsAClearError) {
  auto meta = linear_stack(2, 8, tensor::Device::meta());
  EXPECT_THROW(
      parallel::FullyShardedDataParallel(
          *meta, world(), factory(Opt::adamw),
          {.auto_wrap_policy = parallel::module_type_auto_wrap_policy<nn::Linear>(), .device = tensor::Device::meta()}),
      InvalidArgument);
}

}  // namespace
}  // namespace troupe::train
