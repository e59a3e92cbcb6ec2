// gpt_bench: one training step of troupe's GPT on the CPU, in tokens/s.
//
//   build/bench/gpt_bench [--model small|tiny]... [--repeats N] [--min-time S] [--checkpoint-every K]
//
// A step: zero_grad, forward, cross-entropy over (B, T, V), backward, gradient
// clipping at 1.0, AdamW (betas 0.9/0.95, weight decay 0.1 on matrices). Models, both
// character-level (V = 65, dropout 0, one thread):
//   small  nanoGPT's shakespeare_char: 6 layers, 6 heads, C = 384, T = 256, batch 4
//   tiny   2 layers, 4 heads, C = 128, T = 64, batch 16
// The baseline is bench/torch_gpt_step.py: the same model (nanoGPT's torch.nn code),
// step, batches and thread count in PyTorch eager, timed the same way and printing
// the same JSON; bench/run pairs the two by model (train_bench.cpp says why these are
// two programs). Timing: 4 batches of random ids made once and cycled; 4 warm-up
// steps, the last 2 sizing a repeat to about --min-time (at least 2 steps); median of
// --repeats repeats, each in process CPU time. --checkpoint-every K recomputes every
// K-th block's activations in backward (GPT::checkpoint_blocks; bench/run's parallel
// area). activation_peak_bytes: the most host memory one step held beyond what was live
// before it (parameters, gradients, optimizer state; the last step's caches released),
// measured on a step after warm-up.
//
// Output, a JSON list, one object per model:
//   {"model": "small", "params": N, "batch": B, "time": T, "tokens_per_s": ..., "step_ms": ...,
//    "repeats": [tokens/s, ...], "steps_per_repeat": N, "loss": last loss,
//    "checkpoint_every": K, "activation_peak_bytes": N}
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "random_ids.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using bench::cpu_seconds;
using tensor::Tensor;

namespace {

struct Model {
  std::string name;
  nn::GPTConfig config;
  std::int64_t batch;
};

const std::vector<Model>& models() {
  static const std::vector<Model> all{
      {"small", {.block_size = 256, .vocab_size = 65, .n_layer = 6, .n_head = 6, .n_embd = 384}, 4},
      {"tiny", {.block_size = 64, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 128}, 16}};
  return all;
}

struct Flags {
  std::vector<std::string> models;
  int repeats = 5;
  double min_time = 2.0;
  std::int64_t checkpoint_every = 0;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    TROUPE_CHECK(i + 1 < argc, "gpt_bench: ", flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model")
      f.models.push_back(value);
    else if (flag == "--repeats")
      f.repeats = std::stoi(value);
    else if (flag == "--min-time")
      f.min_time = std::stod(value);
    else if (flag == "--checkpoint-every")
      f.checkpoint_every = std::stoll(value);
    else
      throw InvalidArgument("gpt_bench: unknown flag " + flag);
  }
  if (f.models.empty()) f.models = {"tiny", "small"};
  TROUPE_CHECK(f.repeats >= 1 && f.min_time > 0, "gpt_bench: --repeats must be >= 1 and --min-time > 0");
  return f;
}

void time_model(const Model& m, const Flags& flags, bool first) {
  nn::GPT model(m.config, 0);
  model.checkpoint_blocks(flags.checkpoint_every);
  nn::AdamW opt(model.named_parameters(), 6e-4, {0.9, 0.95}, 1e-8, 0.1);
  opt.set_weight_decay_filter(nn::decay_matrices_only);
  nn::CrossEntropyLoss loss_fn;
  tensor::Generator gen(1);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 4; ++i) {
    Tensor x = bench::random_ids(m.batch, m.config.block_size, m.config.vocab_size, gen);
    batches.emplace_back(x, bench::random_ids(m.batch, m.config.block_size, m.config.vocab_size, gen));
  }
  std::size_t n = 0;
  double loss = 0;
  auto step = [&] {
    const auto& [x, y] = batches[n++ % batches.size()];
    opt.zero_grad();
    loss = loss_fn.forward(model.forward(x), y).item();
    model.backward(loss_fn.backward());
    nn::clip_grad_norm(model.named_parameters(), 1.0);
    opt.step();
  };
  for (int i = 0; i < 2; ++i) step();
  model.release_activations();  // a layer keeps its cache until its next forward
  const std::size_t live = tensor::host_memory_stats().live_bytes;
  tensor::reset_host_memory_peak();
  step();
  const std::size_t activation_peak = tensor::host_memory_stats().peak_bytes - live;
  const double sizing = cpu_seconds();
  for (int i = 0; i < 2; ++i) step();
  const double per_step = (cpu_seconds() - sizing) / 2;
  const auto steps = std::max<std::int64_t>(2, static_cast<std::int64_t>(flags.min_time / std::max(per_step, 1e-9)));
  const double tokens = static_cast<double>(m.batch * m.config.block_size * steps);
  std::vector<double> repeats;
  for (int r = 0; r < flags.repeats; ++r) {
    const double start = cpu_seconds();
    for (std::int64_t i = 0; i < steps; ++i) step();
    repeats.push_back(tokens / (cpu_seconds() - start));
  }
  TROUPE_CHECK(std::isfinite(loss), "gpt_bench: the loss of ", m.name, " is not finite");
  const double median = bench::lower_median(repeats);
  std::printf(
      "%s\n {\"model\": \"%s\", \"params\": %lld, \"batch\": %lld, \"time\": %lld, \"tokens_per_s\": %.1f, "
      "\"step_ms\": %.2f, \"repeats\": [",
      first ? "" : ",", m.name.c_str(), static_cast<long long>(model.parameter_count()),
      static_cast<long long>(m.batch), static_cast<long long>(m.config.block_size), median,
      1e3 * static_cast<double>(m.batch * m.config.block_size) / median);
  for (std::size_t i = 0; i < repeats.size(); ++i) std::printf("%s%.1f", i ? ", " : "", repeats[i]);
  std::printf(
      "], \"steps_per_repeat\": %lld, \"loss\": %.6g, \"checkpoint_every\": %lld, \"activation_peak_bytes\": %zu}",
      static_cast<long long>(steps), loss, static_cast<long long>(flags.checkpoint_every), activation_peak);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_main("gpt_bench", [&] {
    const Flags flags = parse_flags(argc, argv);
    tensor::set_num_threads(1);
    std::printf("[");
    for (std::size_t i = 0; i < flags.models.size(); ++i) {
      const auto it =
          std::find_if(models().begin(), models().end(), [&](const Model& m) { return m.name == flags.models[i]; });
      TROUPE_CHECK(it != models().end(), "gpt_bench: unknown model '", flags.models[i], "' (small or tiny)");
      time_model(*it, flags, i == 0);
    }
    std::printf("\n]\n");
    return 0;
  });
}
