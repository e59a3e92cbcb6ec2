// Transformer pieces: causal attention, module trees with a tied weight, GPT.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "token_ids.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/tensor/attention.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/tensor/meta.hpp"

using namespace troupe;
using nn::testing::token_ids;
using namespace troupe::nn;
using tensor::DType;
using tensor::Generator;

namespace {

GPTConfig tiny_config(double dropout = 0.0) {
  return {.block_size = 6, .vocab_size = 7, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = dropout};
}

}  // namespace

TEST(CausalSelfAttention, BackwardMatchesFiniteDifferences) {
  Generator gen(5);
  CausalSelfAttention attn(8, 2, gen, 0.0, true, 0, DType::f64);
  const Tensor x = tensor::normal({2, 5, 8}, 0, 1, gen, DType::f64);
  gradcheck::expect_module_gradients(attn, x);
}

TEST(CausalSelfAttention, BackwardMatchesFiniteDifferencesWithAttentionDropout) {
  Generator gen(6);
  CausalSelfAttention attn(8, 2, gen, 0.3, true, 42, DType::f64);
  auto* attn_dropout = static_cast<Dropout*>(attn.named_children()[2].module);
  auto* resid_dropout = static_cast<Dropout*>(attn.named_children()[3].module);
  const auto a = attn_dropout->generator(), r = resid_dropout->generator();
  const Tensor x = tensor::normal({2, 4, 8}, 0, 1, gen, DType::f64);
  gradcheck::GradCheck opt;
  opt.before_forward = [&] {  // the same masks for every evaluation
    attn_dropout->generator() = a;
    resid_dropout->generator() = r;
  };
  gradcheck::expect_module_gradients(attn, x, opt);
}

TEST(CausalSelfAttention, APositionSeesOnlyItselfAndEarlierPositions) {
  Generator gen(7);
  CausalSelfAttention attn(8, 4, gen);
  Tensor x = tensor::normal({1, 6, 8}, 0, 1, gen);
  const std::vector<float> before = attn.forward(x).to_vector<float>();
  x.data<float>()[4 * 8 + 3] += 1.0f;  // change position 4
  const std::vector<float> after = attn.forward(x).to_vector<float>();
  for (std::int64_t t = 0; t < 6; ++t) {
    const bool same = std::equal(before.begin() + t * 8, before.begin() + (t + 1) * 8, after.begin() + t * 8);
    EXPECT_EQ(same, t < 4) << "position " << t;
  }
}

TEST(CausalSelfAttention, BadShapesAreNamed) {
  Generator gen(8);
  CausalSelfAttention attn(8, 2, gen);
  EXPECT_THROW(attn.forward(Tensor::zeros({2, 8})), InvalidArgument);
  EXPECT_THROW(attn.forward(Tensor::zeros({1, 2, 6})), InvalidArgument);
  EXPECT_THROW(CausalSelfAttention(8, 3, gen), InvalidArgument);
  Generator g2(1);
  EXPECT_THROW(tensor::causal_attention_forward(Tensor::zeros({1, 2, 10}), 2, 0.0, g2), InvalidArgument);
}

// bf16 (the GPT's --precision bf16) runs in f32 on the CPU and rounds the results.
TEST(CausalSelfAttention, Bf16IsComputedInF32AndRounded) {
  Generator gen(9), g1(1), g2(1);
  const Tensor qkv = tensor::normal({2, 9, 24}, 0, 1, gen, DType::bf16);
  const Tensor gy = tensor::normal({2, 9, 8}, 0, 1, gen, DType::bf16);
  const auto low = tensor::causal_attention_forward(qkv, 2, 0.0, g1);
  const auto wide = tensor::causal_attention_forward(qkv.to(DType::f32), 2, 0.0, g2);
  EXPECT_EQ(low.out.dtype(), DType::bf16);
  EXPECT_TRUE(tensor::equal(low.out, wide.out.to(DType::bf16)));
  const Tensor d_low = tensor::causal_attention_backward(gy, qkv, low, 2);
  const Tensor d_wide = tensor::causal_attention_backward(gy.to(DType::f32), qkv.to(DType::f32), wide, 2);
  EXPECT_TRUE(tensor::equal(d_low, d_wide.to(DType::bf16)));
}

namespace {

struct DenseAttention {
  std::vector<double> out, lse, dqkv;
};

// Causal attention over every (i, j <= i) in double, the plain way: the reference for
// the CPU's blocks of query rows (tensor/src/attention.cpp).
DenseAttention dense_attention(const std::vector<double>& qkv, const std::vector<double>& gy, std::int64_t B,
                               std::int64_t T, std::int64_t H, std::int64_t D) {
  const std::int64_t C = H * D;
  const double scale = 1 / std::sqrt(static_cast<double>(D));
  DenseAttention r{std::vector<double>(static_cast<std::size_t>(B * T * C)),
                   std::vector<double>(static_cast<std::size_t>(B * H * T)), std::vector<double>(qkv.size())};
  const auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h, std::int64_t e) {
    return static_cast<std::size_t>((b * T + t) * 3 * C + part * C + h * D + e);
  };
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<std::vector<double>> p(static_cast<std::size_t>(T));
      for (std::int64_t i = 0; i < T; ++i) {
        auto& row = p[static_cast<std::size_t>(i)];
        double m = -1e300, sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::int64_t e = 0; e < D; ++e) s += qkv[at(b, i, 0, h, e)] * qkv[at(b, j, 1, h, e)];
          row.push_back(s * scale);
          m = std::max(m, s * scale);
        }
        for (double& v : row) sum += (v = std::exp(v - m));
        for (double& v : row) v /= sum;
        r.lse[static_cast<std::size_t>((b * H + h) * T + i)] = m + std::log(sum);
        for (std::int64_t e = 0; e < D; ++e) {
          double o = 0;
          for (std::int64_t j = 0; j <= i; ++j) o += row[static_cast<std::size_t>(j)] * qkv[at(b, j, 2, h, e)];
          r.out[static_cast<std::size_t>((b * T + i) * C + h * D + e)] = o;
        }
      }
      for (std::int64_t i = 0; i < T; ++i) {
        const auto& row = p[static_cast<std::size_t>(i)];
        const double* g = gy.data() + (b * T + i) * C + h * D;
        std::vector<double> ds(static_cast<std::size_t>(i + 1));
        double dot = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (std::int64_t e = 0; e < D; ++e) dp += g[e] * qkv[at(b, j, 2, h, e)];
          ds[static_cast<std::size_t>(j)] = dp;
          dot += row[static_cast<std::size_t>(j)] * dp;
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const double pij = row[static_cast<std::size_t>(j)];
          const double dsij = pij * (ds[static_cast<std::size_t>(j)] - dot) * scale;
          for (std::int64_t e = 0; e < D; ++e) {
            r.dqkv[at(b, j, 2, h, e)] += pij * g[e];
            r.dqkv[at(b, i, 0, h, e)] += dsij * qkv[at(b, j, 1, h, e)];
            r.dqkv[at(b, j, 1, h, e)] += dsij * qkv[at(b, i, 0, h, e)];
          }
        }
      }
    }
  }
  return r;
}

double max_error(const tensor::Tensor& got, const std::vector<double>& want) {
  const std::vector<double> g = got.to(DType::f64).to_vector<double>();
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(g[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return worst / scale;
}

}  // namespace

// T = 150: two whole blocks of 64 query rows and a tail, in f64 and f32.
// Both backward paths: head size 8 recomputes P from the log-sum-exp (T > 6 D), head
// size 32 keeps it from the forward.
TEST(CausalSelfAttention, BlocksOfQueryRowsMatchADenseReference) {
  const std::int64_t B = 2, T = 150, H = 2;
  for (const std::int64_t D : {8, 32}) {
    Generator gen(11);
    const tensor::Tensor qkv = tensor::normal({B, T, 3 * H * D}, 0, 1.5, gen, DType::f64);
    const tensor::Tensor gy = tensor::normal({B, T, H * D}, 0, 1, gen, DType::f64);
    const DenseAttention want = dense_attention(qkv.to_vector<double>(), gy.to_vector<double>(), B, T, H, D);
    for (const DType dtype : {DType::f64, DType::f32}) {
      const double bound = dtype == DType::f64 ? 1e-12 : 1e-5;
      Generator g(1);
      const auto fwd = tensor::causal_attention_forward(qkv.to(dtype), H, 0.0, g);
      EXPECT_EQ(fwd.probs.defined(), D == 32) << "P is kept where T <= 6 D";
      EXPECT_LE(max_error(fwd.out, want.out), bound) << dtype << ", D " << D;
      EXPECT_LE(max_error(fwd.log_sum_exp, want.lse), bound) << dtype << ", D " << D;
      const tensor::Tensor dqkv = tensor::causal_attention_backward(gy.to(dtype), qkv.to(dtype), fwd, H);
      EXPECT_LE(max_error(dqkv, want.dqkv), bound) << dtype << ", D " << D;
      // The kept P and the one recomputed from the log-sum-exp give the same gradients.
      tensor::AttentionForward recomputed = fwd;
      recomputed.probs = tensor::Tensor();
      EXPECT_LE(max_error(tensor::causal_attention_backward(gy.to(dtype), qkv.to(dtype), recomputed, H), want.dqkv),
                bound)
          << dtype << ", D " << D;
    }
  }
  // Kept probabilities of another shape are refused.
  Generator g(2);
  const tensor::Tensor qkv = tensor::normal({1, 8, 12}, 0, 1, g);
  tensor::AttentionForward fwd = tensor::causal_attention_forward(qkv, 2, 0.0, g);
  fwd.probs = tensor::Tensor::zeros({1, 2, 8, 7});
  EXPECT_THROW(tensor::causal_attention_backward(tensor::Tensor::zeros({1, 8, 4}), qkv, fwd, 2), InvalidArgument);
}

namespace {

// With attention dropout the masks come from the scores' positions; central differences
// at 60 coordinates spread over the three blocks check the gradients there.
void check_dropout_gradients_across_blocks(std::int64_t D) {
  const std::int64_t T = 150, H = 2;
  Generator gen(12);
  tensor::Tensor qkv = tensor::normal({1, T, 3 * H * D}, 0, 1, gen, DType::f64);
  const tensor::Tensor gy = tensor::normal({1, T, H * D}, 0, 1, gen, DType::f64);
  const auto loss = [&] {
    Generator g(5);
    const auto fwd = tensor::causal_attention_forward(qkv, H, 0.3, g);
    return tensor::sum(tensor::mul(fwd.out, gy)).item();
  };
  Generator g(5);
  const auto fwd = tensor::causal_attention_forward(qkv, H, 0.3, g);
  const std::vector<double> grad = tensor::causal_attention_backward(gy, qkv, fwd, H).to_vector<double>();
  double* x = qkv.data<double>();
  for (std::int64_t c = 0; c < 60; ++c) {
    const std::int64_t at = (c * 7919) % qkv.numel();
    const double keep = x[at], eps = 1e-6;
    x[at] = keep + eps;
    const double up = loss();
    x[at] = keep - eps;
    const double down = loss();
    x[at] = keep;
    EXPECT_NEAR(grad[static_cast<std::size_t>(at)], (up - down) / (2 * eps), 1e-6)
        << "coordinate " << at << ", D " << D;
  }
}

}  // namespace

TEST(CausalSelfAttention, DropoutGradientsHoldAcrossBlocks) {
  for (const std::int64_t D : {8, 32}) check_dropout_gradients_across_blocks(D);  // P recomputed, then kept
}

TEST(GPT, HasNanoGPTsNamesWithTheHeadTiedToTheTokenTable) {
  GPT model(tiny_config(), 1);
  std::vector<std::string> names;
  for (const auto& [name, param] : model.named_parameters()) names.push_back(name);
  // The tied table once, under its first name; lm_head.weight only in the state dict.
  EXPECT_EQ(names.front(), "transformer.wte.weight");
  EXPECT_EQ(names[1], "transformer.wpe.weight");
  EXPECT_EQ(std::count(names.begin(), names.end(), "lm_head.weight"), 0);
  for (const char* name :
       {"transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_proj.bias",
        "transformer.h.1.ln_2.bias", "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight",
        "transformer.ln_f.weight", "transformer.ln_f.bias"})
    EXPECT_EQ(std::count(names.begin(), names.end(), name), 1) << name;
  EXPECT_EQ(names.size(), 2u + 2 * 12 + 2);
  const StateDict state = model.state_dict();
  ASSERT_NE(state.find("lm_head.weight"), nullptr);
  EXPECT_TRUE(state.find("lm_head.weight")->shares_storage_with(*state.find("transformer.wte.weight")));
  EXPECT_EQ(state.size(), names.size() + 1);
  // C=8, V=7, T=6: wte 56 + wpe 48 + 2 blocks of (2 LN 32 + c_attn 216 + c_proj 72 + c_fc 288 + c_proj 264) + ln_f 16
  EXPECT_EQ(model.parameter_count(), 56 + 48 + 2 * (32 + 216 + 72 + 288 + 264) + 16);
  EXPECT_EQ(model.non_embedding_parameter_count(), model.parameter_count() - 48);
}

TEST(GPT, InitialisesAsGPT2) {
  GPTConfig config{.block_size = 64, .vocab_size = 50, .n_layer = 4, .n_head = 4, .n_embd = 64};
  GPT model(config, 3);
  for (const auto& [name, param] : model.named_parameters()) {
    const std::vector<float> v = param->data.to_vector<float>();
    double sum2 = 0;
    for (float x : v) sum2 += static_cast<double>(x) * x;
    const double rms = std::sqrt(sum2 / static_cast<double>(v.size()));
    if (name.ends_with(".bias")) {
      EXPECT_EQ(rms, 0.0) << name;
    } else if (name.find(".ln_") != std::string::npos) {
      EXPECT_EQ(rms, 1.0) << name;  // LayerNorm weight
    } else if (name.ends_with("c_proj.weight")) {
      EXPECT_NEAR(rms, 0.02 / std::sqrt(8.0), 0.002) << name;
    } else {
      EXPECT_NEAR(rms, 0.02, 0.002) << name;
    }
  }
}

// Described on the meta device, then materialised: the model a CPU build holds, bit
// for bit, with the tied head still one tensor -- what sharded construction relies on.
TEST(GPT, BuiltOnTheMetaDeviceMaterialisesToTheCpuBuild) {
  GPTConfig config{.block_size = 32, .vocab_size = 40, .n_layer = 3, .n_head = 2, .n_embd = 32};
  GPT cpu(config, 5);
  GPT meta(config, 5, DType::f32, tensor::Device::meta());
  const auto live = tensor::host_memory_stats().live_bytes;
  for (const auto& [name, param] : meta.named_parameters()) EXPECT_TRUE(tensor::is_meta(param->data)) << name;
  EXPECT_EQ(meta.parameter_count(), cpu.parameter_count());
  EXPECT_EQ(tensor::host_memory_stats().live_bytes, live);
  meta.to(tensor::Device::cpu());
  const nn::StateDict a = cpu.state_dict(), b = meta.state_dict();
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& [key, value] : a) {
    const Tensor& other = b.at(key);
    ASSERT_EQ(value.shape(), other.shape()) << key;
    EXPECT_EQ(std::memcmp(value.raw_data(), other.raw_data(), value.nbytes()), 0) << key;
  }
  EXPECT_TRUE(b.at("lm_head.weight").shares_storage_with(b.at("transformer.wte.weight")));
}

TEST(GPT, BackwardMatchesFiniteDifferencesThroughTheTiedTable) {
  GPT model(tiny_config(), 2, DType::f64);
  gradcheck::expect_module_gradients(model, token_ids(2, 5, 7, 11));
}

TEST(GPT, TheTiedTableIsReportedReadyOnceAfterBothUses) {
  GPT model(tiny_config(), 4);
  std::vector<std::string> ready;
  model.set_grad_ready_hook([&](const std::string& name, Parameter&) { ready.push_back(name); });
  CrossEntropyLoss loss;
  const Tensor ids = token_ids(2, 6, 7, 12);
  for (int step = 0; step < 2; ++step) {
    ready.clear();
    loss.forward(model.forward(ids), token_ids(2, 6, 7, 13));
    model.backward(loss.backward());
    EXPECT_EQ(ready.size(), model.named_parameters().size());
    EXPECT_EQ(std::set<std::string>(ready.begin(), ready.end()).size(), ready.size());
    EXPECT_EQ(ready.back(), "transformer.wte.weight");  // its last use is the first layer
  }
}

TEST(GPT, LearnsToPredictARepeatingSequence) {
  GPTConfig config{.block_size = 8, .vocab_size = 5, .n_layer = 2, .n_head = 2, .n_embd = 16};
  GPT model(config, 5);
  AdamW opt(model.named_parameters(), 3e-3, {0.9, 0.95}, 1e-8, 0.1);
  opt.set_weight_decay_filter(decay_matrices_only);
  std::vector<std::int64_t> seq, next;
  for (int i = 0; i < 8; ++i) seq.push_back(i % 5), next.push_back((i + 1) % 5);
  const Tensor x = Tensor::from_vector(seq, {1, 8}), y = Tensor::from_vector(next, {1, 8});
  CrossEntropyLoss loss;
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    const double l = loss.forward(model.forward(x), y).item();
    if (step == 0) first = l;
    last = l;
    opt.zero_grad();
    model.backward(loss.backward());
    opt.step();
  }
  EXPECT_NEAR(first, std::log(5.0), 0.2);
  EXPECT_LT(last, 0.05);
  Generator gen(1);
  // Within the one window it trained on (positions 0-7).
  const auto text = model.generate({0, 1, 2}, 5, 0.0, gen);
  EXPECT_EQ(text, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_TRUE(model.is_training());  // generate restores the mode
}

TEST(GPT, ASequenceLongerThanTheBlockIsAnError) {
  GPT model(tiny_config(), 1);
  EXPECT_THROW(model.forward(token_ids(1, 7, 7, 1)), InvalidArgument);
  EXPECT_THROW(model.forward(Tensor::from_vector(std::vector<std::int64_t>{0, 7}, {1, 2})), InvalidArgument);
}

TEST(AdamW, ADecayFilterLeavesBiasesAndNormsUndecayed) {
  GPT model(tiny_config(), 6);
  AdamW opt(model.named_parameters(), 0.1, {}, 1e-8, 0.5);
  opt.set_weight_decay_filter(decay_matrices_only);
  for (auto& [name, param] : model.named_parameters()) param->grad = Tensor::zeros(param->data.shape());
  const StateDict before = model.state_dict();
  std::vector<Tensor> copies;
  for (const auto& [name, t] : before) copies.push_back(t.clone());
  opt.step();
  std::size_t i = 0;
  for (const auto& [name, t] : model.state_dict()) {
    const bool matrix = t.dim() >= 2;
    EXPECT_EQ(tensor::equal(t, copies[i++]), !matrix) << name;  // zero grad: only decay moves it
  }
}
