// gpu_gpt_bench: issue 24's GPU figures, on one CUDA device.
//
//   build/bench/gpu_gpt_bench [--precision f32|bf16]... [--batch N] [--repeats N] [--steps N]
//                             [--breakdown | --ops]
//
// 1. Causal attention, forward + backward (tensor/attention.hpp's fused kernels) on
//    GPT-2 small's shapes: batch 8, T = 1024, 12 heads of 64, qkv [B, T, 3C] as
//    c_attn writes it. The baseline is torch's scaled_dot_product_attention
//    (bench/torch_gpu_gpt.py: its flash backend in bf16; f32, which flash does not
//    take, gets its memory-efficient backend).
// 2. A GPT-2-small-shaped training step: 12 layers, 12 heads, C = 768, T = 1024,
//    V = 50257 (124M parameters, lm_head tied), dropout 0; zero_grad, forward,
//    cross-entropy over (B, T, V), backward, clipping at 1.0, AdamW (0.9/0.95, decay
//    0.1 on matrices), on 2 resident batches of random ids. bf16 is troupe's mixed
//    precision (a bf16 model stepping f32 master weights) against torch's autocast.
//
// Timing: --steps calls between two device synchronisations, after 3 warm-up calls;
// the median of --repeats. Output: a JSON list, one object per case. --breakdown
// times each phase of the step instead (a synchronisation after each), to show where
// a step's time goes; --ops times each kind of layer of the model alone, forward and
// forward + backward, on the step's shapes (N = batch x 1024 rows), to show which.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/clip.hpp"
#include "troupe/nn/embedding.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/layer_norm.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/parallel/master_weights.hpp"
#include "troupe/tensor/attention.hpp"
#include "troupe/tensor/cuda_memory.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using tensor::Device;
using tensor::DType;
using tensor::Tensor;

namespace {

struct Flags {
  std::vector<std::string> precisions;
  std::int64_t batch = 8;
  int repeats = 5, steps = 5;
  bool breakdown = false;  // time each phase of the step instead
  bool ops = false;        // time each kind of layer alone instead
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--breakdown" || flag == "--ops") {
      (flag == "--ops" ? f.ops : f.breakdown) = true;
      continue;
    }
    if (i + 1 >= argc) throw InvalidArgument("gpu_gpt_bench: " + flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (flag == "--precision")
        f.precisions.push_back(value);
      else if (flag == "--batch")
        f.batch = std::stoll(value);
      else if (flag == "--repeats")
        f.repeats = std::stoi(value);
      else if (flag == "--steps")
        f.steps = std::stoi(value);
      else
        throw InvalidArgument("gpu_gpt_bench: unknown flag " + flag);
    } catch (const std::logic_error&) {
      throw InvalidArgument("gpu_gpt_bench: bad value '" + value + "' for " + flag);
    }
  }
  if (f.precisions.empty()) f.precisions = {"f32", "bf16"};
  for (const auto& p : f.precisions)
    if (p != "f32" && p != "bf16") throw InvalidArgument("gpu_gpt_bench: --precision is f32 or bf16, got " + p);
  if (f.batch < 1 || f.repeats < 1 || f.steps < 1)
    throw InvalidArgument("gpu_gpt_bench: --batch, --repeats and --steps must be >= 1");
  return f;
}

// The median of `repeats` timings of `steps` calls of f, in milliseconds per call.
double median_ms_per_call(const std::function<void()>& f, int repeats, int steps) {
  for (int i = 0; i < 3; ++i) f();
  tensor::cuda_synchronize();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) f();
    tensor::cuda_synchronize();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                    steps);
  }
  std::sort(times.begin(), times.end());
  return times[(times.size() - 1) / 2];  // the lower median, as the baseline's median_low
}

const nn::GPTConfig kGpt2Small{.block_size = 1024, .vocab_size = 50257, .n_layer = 12, .n_head = 12, .n_embd = 768};

double time_attention(DType dtype, const Flags& flags) {
  const std::int64_t B = flags.batch, T = kGpt2Small.block_size, H = kGpt2Small.n_head, C = kGpt2Small.n_embd;
  tensor::Generator gen(0);
  const Tensor qkv = tensor::normal({B, T, 3 * C}, 0, 1, gen, dtype, Device::cuda());
  const Tensor gy = tensor::normal({B, T, C}, 0, 1, gen, dtype, Device::cuda());
  return median_ms_per_call(
      [&] {
        const auto f = tensor::causal_attention_forward(qkv, H, 0.0, gen);
        tensor::causal_attention_backward(gy, qkv, f, H);
      },
      flags.repeats, flags.steps);
}

Tensor random_ids(std::int64_t batch, std::int64_t time, std::int64_t vocab, std::mt19937_64& rng) {
  Tensor ids = Tensor::empty({batch, time}, DType::i64);
  for (std::int64_t i = 0; i < batch * time; ++i)
    ids.data<std::int64_t>()[i] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(vocab));
  return ids;
}

struct StepResult {
  double step_ms = 0, loss = 0;
  std::int64_t params = 0;
};

StepResult time_step(DType dtype, const Flags& flags) {
  nn::GPT model(kGpt2Small, 0);
  if (dtype == DType::bf16) model.to(DType::bf16);
  model.to(Device::cuda());
  std::unique_ptr<parallel::MasterWeights> master =
      dtype == DType::bf16 ? std::make_unique<parallel::MasterWeights>(model) : nullptr;
  nn::AdamW opt(master ? master->named_parameters() : model.named_parameters(), 6e-4, {0.9, 0.95}, 1e-8, 0.1);
  opt.set_weight_decay_filter(nn::decay_matrices_only);
  nn::CrossEntropyLoss loss_fn;
  std::mt19937_64 rng(1);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 2; ++i) {
    Tensor x = random_ids(flags.batch, kGpt2Small.block_size, kGpt2Small.vocab_size, rng);
    batches.emplace_back(x,
                         random_ids(flags.batch, kGpt2Small.block_size, kGpt2Small.vocab_size, rng).to(Device::cuda()));
  }
  std::size_t n = 0;
  Tensor loss;
  // With a phase timer, each phase ends with a synchronisation and adds its time.
  std::vector<std::pair<const char*, double>> phases;
  const auto phase = [&](std::size_t i, const char* name, const auto& f) {
    if (!flags.breakdown) return f();
    const auto start = std::chrono::steady_clock::now();
    f();
    tensor::cuda_synchronize();
    if (phases.size() <= i) phases.emplace_back(name, 0.0);
    phases[i].second += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  auto step = [&] {
    const auto& [x, y] = batches[n++ % batches.size()];
    Tensor logits;
    phase(0, "zero_grad", [&] { model.zero_grad(); });
    phase(1, "forward", [&] { logits = model.forward(x); });
    phase(2, "loss forward", [&] { loss = loss_fn.forward(logits, y); });
    phase(3, "loss backward", [&] { logits = loss_fn.backward(); });
    phase(4, "model backward", [&] { model.backward(logits); });
    phase(5, "gradients to f32 masters", [&] {
      if (master) master->copy_gradients_to_master();
    });
    phase(6, "clip_grad_norm",
          [&] { nn::clip_grad_norm(master ? master->named_parameters() : model.named_parameters(), 1.0); });
    phase(7, "AdamW step", [&] { opt.step(); });
    phase(8, "masters to the bf16 model", [&] {
      if (master) master->copy_master_to_model();
    });
  };
  if (flags.breakdown) {
    for (int i = 0; i < 3; ++i) step();
    phases.clear();
    for (int i = 0; i < flags.steps; ++i) step();
    std::printf("{\"breakdown\": \"%s\", \"ms_per_step\": {", tensor::dtype_name(dtype).data());
    for (std::size_t i = 0; i < phases.size(); ++i)
      std::printf("%s\"%s\": %.3f", i ? ", " : "", phases[i].first, phases[i].second / flags.steps);
    std::printf("}}\n");
    return {};
  }
  StepResult r;
  r.step_ms = median_ms_per_call(step, flags.repeats, flags.steps);
  r.loss = loss.item();
  r.params = model.parameter_count();
  TROUPE_CHECK(std::isfinite(r.loss), "gpu_gpt_bench: the ", tensor::dtype_name(dtype), " GPT's loss is not finite");
  return r;
}

// Each kind of layer of a GPT-2-small block, the loss and the head alone, on the
// step's shapes: one JSON line of milliseconds per call.
void time_ops(DType dtype, const Flags& flags) {
  const std::int64_t T = kGpt2Small.block_size, N = flags.batch * T, C = kGpt2Small.n_embd, V = kGpt2Small.vocab_size;
  const Device gpu = Device::cuda();
  tensor::Generator gen(0);
  const auto rows_of = [&](std::int64_t cols) { return tensor::normal({N, cols}, 0, 1, gen, dtype, gpu); };
  std::vector<std::pair<std::string, double>> times;
  const auto time = [&](const std::string& name, const std::function<void()>& f) {
    times.emplace_back(name, median_ms_per_call(f, flags.repeats, flags.steps));
  };
  const auto forward_and_backward = [&](const std::string& name, nn::Module& m, const Tensor& x, const Tensor& gy) {
    time(name + " forward", [&] { m.forward(x); });
    time(name + " forward+backward", [&] {
      m.forward(x);
      m.backward(gy);
    });
  };
  struct Shape {
    const char* name;
    std::int64_t in, out;
  };
  for (const Shape& s : {Shape{"attn.c_attn", C, 3 * C}, Shape{"attn.c_proj", C, C}, Shape{"mlp.c_fc", C, 4 * C},
                         Shape{"mlp.c_proj", 4 * C, C}}) {
    nn::Linear linear(s.in, s.out, gen, true, dtype, gpu);
    forward_and_backward(s.name, linear, rows_of(s.in), rows_of(s.out));
  }
  {
    nn::Linear head(C, V, gen, false, dtype, gpu);
    forward_and_backward("lm_head", head, rows_of(C), rows_of(V));
  }
  {
    const Tensor qkv = rows_of(3 * C).reshape({flags.batch, T, 3 * C});
    time("attention forward", [&] { tensor::causal_attention_forward(qkv, kGpt2Small.n_head, 0.0, gen); });
  }
  {
    const Tensor x = rows_of(3 * C), bias = tensor::normal({3 * C}, 0, 1, gen, dtype, gpu);
    Tensor y = x.clone();
    time("bias add [N, 3C] + [3C]", [&] { tensor::add_(y, bias); });
    const Tensor a = rows_of(C), b = rows_of(C);
    time("residual add [N, C]", [&] { tensor::add(a, b); });
  }
  {
    nn::GELU gelu(nn::GeluApproximate::tanh);
    forward_and_backward("gelu (tanh) [N, 4C]", gelu, rows_of(4 * C), rows_of(4 * C));
    nn::LayerNorm norm(C, 1e-5, true, dtype, gpu);
    forward_and_backward("layer norm [N, C]", norm, rows_of(C), rows_of(C));
  }
  {
    std::mt19937_64 rng(2);
    nn::Embedding wte(V, C, gen, dtype, gpu);
    const Tensor ids = random_ids(flags.batch, T, V, rng);  // on the host, as the step passes them
    forward_and_backward("embedding [B, T] -> [B, T, C]", wte, ids,
                         tensor::normal({flags.batch, T, C}, 0, 1, gen, dtype, gpu));
    const Tensor logits = rows_of(V), targets = random_ids(N, 1, V, rng).reshape({N}).to(gpu);
    nn::CrossEntropyLoss loss;
    time("cross entropy [N, V] forward", [&] { loss.forward(logits, targets); });
    time("cross entropy [N, V] forward+backward", [&] {
      loss.forward(logits, targets);
      loss.backward();
    });
  }
  std::printf("{\"ops\": \"%s\", \"ms_per_call\": {", tensor::dtype_name(dtype).data());
  for (std::size_t i = 0; i < times.size(); ++i)
    std::printf("%s\"%s\": %.3f", i ? ", " : "", times[i].first.c_str(), times[i].second);
  std::printf("}}\n");
  tensor::cuda_empty_cache();
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_main("gpu_gpt_bench", [&] {
    const Flags flags = parse_flags(argc, argv);
    TROUPE_CHECK(tensor::cuda_available(), "gpu_gpt_bench: no CUDA device here");
    if (flags.breakdown || flags.ops) {
      for (const auto& p : flags.precisions) {
        const DType dtype = p == "bf16" ? DType::bf16 : DType::f32;
        if (flags.ops)
          time_ops(dtype, flags);
        else
          time_step(dtype, flags);
      }
      return 0;
    }
    std::printf("[");
    bool first = true;
    const auto print = [&](const char* text) {
      std::printf("%s\n %s", first ? "" : ",", text);
      std::fflush(stdout);
      first = false;
    };
    char line[512];
    for (const auto& p : flags.precisions) {
      const DType dtype = p == "bf16" ? DType::bf16 : DType::f32;
      std::snprintf(line, sizeof line,
                    "{\"case\": \"attention\", \"precision\": \"%s\", \"batch\": %lld, \"time\": 1024, \"heads\": 12, "
                    "\"head_dim\": 64, \"ms\": %.4f}",
                    p.c_str(), static_cast<long long>(flags.batch), time_attention(dtype, flags));
      print(line);
      tensor::cuda_empty_cache();
    }
    for (const auto& p : flags.precisions) {
      const StepResult r = time_step(p == "bf16" ? DType::bf16 : DType::f32, flags);
      std::snprintf(line, sizeof line,
                    "{\"case\": \"gpt2-small step\", \"precision\": \"%s\", \"batch\": %lld, \"time\": 1024, "
                    "\"params\": %lld, \"ms\": %.4f, \"loss\": %.6g}",
                    p.c_str(), static_cast<long long>(flags.batch), static_cast<long long>(r.params), r.step_ms,
                    r.loss);
      print(line);
      tensor::cuda_empty_cache();
    }
    std::printf("\n]\n");
    return 0;
  });
}
