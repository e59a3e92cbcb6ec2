// gpu_gpt_bench: the GPU figures of issues 24 and 54, on one CUDA device.
//
//   build/bench/gpu_gpt_bench [--precision f32|bf16]... [--batch N]... [--repeats N] [--steps N]
//                             [--attention-calls N] [--vocab-pad M] [--tf32]
//                             [--model gpt2-small|tiny] [--device cuda|cpu]
//                             [--same-work DIR | --breakdown | --ops]
//
// 1. Causal attention, forward + backward (tensor/attention.hpp's fused kernels) on
//    the model's shapes (GPT-2 small: T = 1024, 12 heads of 64), qkv [B, T, 3C] as
//    c_attn writes it, timed over --attention-calls calls a window. The baseline is
//    torch's scaled_dot_product_attention (bench/torch_gpu_gpt.py).
// 2. A GPT-2-small-shaped training step: 12 layers, 12 heads, C = 768, T = 1024,
//    V = 50257 (--vocab-pad 64: nanoGPT's 50304), lm_head tied, dropout 0; zero_grad,
//    forward, cross-entropy over (B, T, V), backward, clipping at 1.0, AdamW (0.9/0.95,
//    decay 0.1 on matrices), on 2 resident batches of random ids. bf16 is troupe's
//    mixed precision (a bf16 model stepping f32 master weights).
// --tf32 allows TF32 in f32 products (tensor/cuda_math.hpp), as torch's allow_tf32.
// --same-work DIR writes DIR/same-work-<model>-v<vocab>.h5 (the initial state dict
// under /init, 10 batches of ids under /batches/x and /y, the optimizer's settings as
// attributes), trains 10 steps from it and prints each step's loss instead of timing:
// torch_gpu_gpt.py --same-work DIR repeats them from the same file. --model tiny
// (T 32, vocabulary 65, 2 layers, 2 heads, C 64) and --device cpu check that
// plumbing on a machine without a GPU (bench/gpu_gpt_same_work_test.py).
//
// Timing: windows of --steps calls (--attention-calls for attention) between two
// device synchronisations, after 3 warm-up calls; the lower median of --repeats
// windows, each window kept in "rounds_ms". Output: a JSON list, one object per case
// (the fields bench/gpu_gpt_table.py pairs on: case, model, precision, tf32, batch,
// vocab). --breakdown times each phase of the step instead (a synchronisation after
// each); --ops each kind of layer of the model alone, forward and forward + backward,
// on the step's shapes (N = batch x T rows), to show where the time goes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "troupe/checkpoint/file_writer.hpp"
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
#include "troupe/tensor/cuda_math.hpp"
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
  std::vector<std::int64_t> batches;
  int repeats = 5, steps = 5, attention_calls = 100;
  std::int64_t vocab_pad = 0;
  bool tf32 = false;
  std::string model = "gpt2-small", device = "cuda", same_work;
  bool breakdown = false;  // time each phase of the step instead
  bool ops = false;        // time each kind of layer alone instead
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--breakdown" || flag == "--ops" || flag == "--tf32") {
      (flag == "--ops" ? f.ops : flag == "--tf32" ? f.tf32 : f.breakdown) = true;
      continue;
    }
    if (i + 1 >= argc) throw InvalidArgument("gpu_gpt_bench: " + flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (flag == "--precision")
        f.precisions.push_back(value);
      else if (flag == "--batch")
        f.batches.push_back(std::stoll(value));
      else if (flag == "--repeats")
        f.repeats = std::stoi(value);
      else if (flag == "--steps")
        f.steps = std::stoi(value);
      else if (flag == "--attention-calls")
        f.attention_calls = std::stoi(value);
      else if (flag == "--vocab-pad")
        f.vocab_pad = std::stoll(value);
      else if (flag == "--model")
        f.model = value;
      else if (flag == "--device")
        f.device = value;
      else if (flag == "--same-work")
        f.same_work = value;
      else
        throw InvalidArgument("gpu_gpt_bench: unknown flag " + flag);
    } catch (const std::logic_error&) {
      throw InvalidArgument("gpu_gpt_bench: bad value '" + value + "' for " + flag);
    }
  }
  if (f.precisions.empty()) f.precisions = {"f32", "bf16"};
  if (f.batches.empty()) f.batches = {8};
  for (const auto& p : f.precisions)
    if (p != "f32" && p != "bf16") throw InvalidArgument("gpu_gpt_bench: --precision is f32 or bf16, got " + p);
  if (f.model != "gpt2-small" && f.model != "tiny")
    throw InvalidArgument("gpu_gpt_bench: --model is gpt2-small or tiny, got " + f.model);
  if (f.device != "cuda" && f.device != "cpu")
    throw InvalidArgument("gpu_gpt_bench: --device is cuda or cpu, got " + f.device);
  if (f.repeats < 1 || f.steps < 1 || f.attention_calls < 1 || f.vocab_pad < 0 ||
      std::any_of(f.batches.begin(), f.batches.end(), [](std::int64_t b) { return b < 1; }))
    throw InvalidArgument(
        "gpu_gpt_bench: --batch, --repeats, --steps and --attention-calls must be >= 1, "
        "--vocab-pad >= 0");
  return f;
}

// The model, and the vocabulary its data ids are drawn from (the unpadded one).
struct ModelSpec {
  nn::GPTConfig config;
  std::int64_t data_vocab;
};

ModelSpec model_spec(const Flags& f) {
  ModelSpec m =
      f.model == "tiny"
          ? ModelSpec{{.block_size = 32, .vocab_size = 65, .n_layer = 2, .n_head = 2, .n_embd = 64}, 65}
          : ModelSpec{{.block_size = 1024, .vocab_size = 50257, .n_layer = 12, .n_head = 12, .n_embd = 768}, 50257};
  if (f.vocab_pad > 0) m.config.vocab_size = (m.data_vocab + f.vocab_pad - 1) / f.vocab_pad * f.vocab_pad;
  return m;
}

Device device_of(const Flags& f) { return f.device == "cpu" ? Device::cpu() : Device::cuda(); }

void synchronize(const Flags& f) {
  if (f.device == "cuda") tensor::cuda_synchronize();
}

struct Timing {
  double ms = 0;                   // the lower median of the windows, per call
  std::vector<double> windows_ms;  // each window's time per call
};

// `repeats` windows of `calls` calls of f after 3 warm-up calls.
Timing time_calls(const Flags& flags, const std::function<void()>& f, int calls) {
  for (int i = 0; i < 3; ++i) f();
  synchronize(flags);
  Timing t;
  for (int r = 0; r < flags.repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    synchronize(flags);
    t.windows_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                           calls);
  }
  std::vector<double> sorted = t.windows_ms;
  std::sort(sorted.begin(), sorted.end());
  t.ms = sorted[(sorted.size() - 1) / 2];  // the lower median, as the baseline's median_low
  return t;
}

std::string json_list(const std::vector<double>& values) {
  std::string out = "[";
  char number[32];
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::snprintf(number, sizeof number, "%s%.9g", i ? ", " : "", values[i]);
    out += number;
  }
  return out + "]";
}

// The fields every row carries, without braces.
std::string common_fields(const Flags& f, const ModelSpec& m, const std::string& precision, std::int64_t batch) {
  char text[256];
  std::snprintf(text, sizeof text,
                "\"model\": \"%s\", \"precision\": \"%s\", \"tf32\": %s, \"batch\": %lld, \"time\": %lld, "
                "\"vocab\": %lld, \"device\": \"%s\"",
                f.model.c_str(), precision.c_str(), f.tf32 ? "true" : "false", static_cast<long long>(batch),
                static_cast<long long>(m.config.block_size), static_cast<long long>(m.config.vocab_size),
                f.device.c_str());
  return text;
}

DType dtype_of(const std::string& precision) { return precision == "bf16" ? DType::bf16 : DType::f32; }

std::string time_attention(const Flags& flags, const ModelSpec& m, const std::string& precision, std::int64_t batch) {
  const std::int64_t T = m.config.block_size, H = m.config.n_head, C = m.config.n_embd;
  const DType dtype = dtype_of(precision);
  tensor::Generator gen(0);
  const Tensor qkv = tensor::normal({batch, T, 3 * C}, 0, 1, gen, dtype, device_of(flags));
  const Tensor gy = tensor::normal({batch, T, C}, 0, 1, gen, dtype, device_of(flags));
  const Timing t = time_calls(
      flags,
      [&] {
        const auto f = tensor::causal_attention_forward(qkv, H, 0.0, gen);
        tensor::causal_attention_backward(gy, qkv, f, H);
      },
      flags.attention_calls);
  char text[160];
  std::snprintf(text, sizeof text, ", \"heads\": %lld, \"head_dim\": %lld, \"calls\": %d, \"ms\": %.4f",
                static_cast<long long>(H), static_cast<long long>(C / H), flags.attention_calls, t.ms);
  return "{\"case\": \"attention\", " + common_fields(flags, m, precision, batch) + text +
         ", \"rounds_ms\": " + json_list(t.windows_ms) + "}";
}

Tensor random_ids(std::initializer_list<std::int64_t> shape, std::int64_t vocab, std::mt19937_64& rng) {
  Tensor ids = Tensor::empty(tensor::Shape(shape), DType::i64);
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    ids.data<std::int64_t>()[i] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(vocab));
  return ids;
}

// The step's optimizer settings, written beside the same-work data for the baseline.
constexpr double kLr = 6e-4, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWeightDecay = 0.1, kClip = 1.0;

// A GPT and its optimizer in one precision: bf16 steps f32 masters.
class Trainer {
 public:
  Trainer(const nn::GPTConfig& config, DType dtype, Device device) : model_(config, 0) {
    const nn::StateDict init = model_.state_dict();  // f32, before any rounding
    if (dtype == DType::bf16) model_.to(DType::bf16);
    model_.to(device);
    if (dtype == DType::bf16) {
      master_ = std::make_unique<parallel::MasterWeights>(model_);
      master_->load_state_dict(model_, init);  // the masters exactly the f32 weights
    }
    opt_ = std::make_unique<nn::AdamW>(parameters(), kLr, nn::Betas{kBeta1, kBeta2}, kEps, kWeightDecay);
    opt_->set_weight_decay_filter(nn::decay_matrices_only);
  }

  // One step; `phase(i, name, f)` runs each part f (the breakdown times them). The
  // loss stays on the device, so that the step does not wait for it.
  template <class Phase>
  Tensor step(const Tensor& x, const Tensor& y, const Phase& phase) {
    Tensor logits, loss;
    phase(0, "zero_grad", [&] { model_.zero_grad(); });
    phase(1, "forward", [&] { logits = model_.forward(x); });
    phase(2, "loss forward", [&] { loss = loss_fn_.forward(logits, y); });
    phase(3, "loss backward", [&] { logits = loss_fn_.backward(); });
    phase(4, "model backward", [&] { model_.backward(logits); });
    phase(5, "gradients to f32 masters", [&] {
      if (master_) master_->copy_gradients_to_master();
    });
    phase(6, "clip_grad_norm", [&] { nn::clip_grad_norm(parameters(), kClip); });
    phase(7, "AdamW step", [&] { opt_->step(); });
    phase(8, "masters to the bf16 model", [&] {
      if (master_) master_->copy_master_to_model();
    });
    return loss;
  }
  Tensor step(const Tensor& x, const Tensor& y) {
    return step(x, y, [](std::size_t, const char*, const auto& f) { f(); });
  }
  const nn::GPT& model() const { return model_; }

 private:
  std::vector<nn::NamedParameter> parameters() {
    return master_ ? master_->named_parameters() : model_.named_parameters();
  }
  nn::GPT model_;
  std::unique_ptr<parallel::MasterWeights> master_;
  std::unique_ptr<nn::AdamW> opt_;
  nn::CrossEntropyLoss loss_fn_;
};

// The step timed (or, with --breakdown, its phases printed); its row, or "".
std::string time_step(const Flags& flags, const ModelSpec& m, const std::string& precision, std::int64_t batch) {
  const Device device = device_of(flags);
  Trainer trainer(m.config, dtype_of(precision), device);
  std::mt19937_64 rng(1);
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int i = 0; i < 2; ++i) {
    const std::int64_t T = m.config.block_size;
    Tensor x = random_ids({batch, T}, m.data_vocab, rng);
    batches.emplace_back(x, random_ids({batch, T}, m.data_vocab, rng).to(device));
  }
  std::size_t n = 0;
  Tensor loss;
  if (flags.breakdown) {
    std::vector<std::pair<const char*, double>> phases;
    const auto phase = [&](std::size_t i, const char* name, const auto& f) {
      const auto start = std::chrono::steady_clock::now();
      f();
      synchronize(flags);
      if (phases.size() <= i) phases.emplace_back(name, 0.0);
      phases[i].second += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    for (int i = 0; i < 3; ++i) trainer.step(batches[i % 2].first, batches[i % 2].second);
    for (int i = 0; i < flags.steps; ++i) trainer.step(batches[i % 2].first, batches[i % 2].second, phase);
    std::printf("{\"breakdown\": \"%s\", \"batch\": %lld, \"ms_per_step\": {", precision.c_str(),
                static_cast<long long>(batch));
    for (std::size_t i = 0; i < phases.size(); ++i)
      std::printf("%s\"%s\": %.3f", i ? ", " : "", phases[i].first, phases[i].second / flags.steps);
    std::printf("}}\n");
    return "";
  }
  const Timing t = time_calls(
      flags,
      [&] {
        const auto& [x, y] = batches[n++ % batches.size()];
        loss = trainer.step(x, y);
      },
      flags.steps);
  const double last = loss.item();
  TROUPE_CHECK(std::isfinite(last), "gpu_gpt_bench: the ", precision, " GPT's loss is not finite");
  const nn::GPTConfig& c = m.config;
  // nanoGPT's estimate_mfu: 6 N + 12 L H Q T per token, N without the position table.
  const double flops_per_token = 6.0 * static_cast<double>(trainer.model().non_embedding_parameter_count()) +
                                 12.0 * static_cast<double>(c.n_layer * c.n_embd * c.block_size);
  char text[256];
  std::snprintf(text, sizeof text, ", \"params\": %lld, \"flops_per_token\": %.6g, \"ms\": %.4f, \"loss\": %.6g",
                static_cast<long long>(trainer.model().parameter_count()), flops_per_token, t.ms, last);
  return "{\"case\": \"step\", " + common_fields(flags, m, precision, batch) + text +
         ", \"rounds_ms\": " + json_list(t.windows_ms) + "}";
}

// The same-work check: the file for the baseline, then each precision's losses.
std::vector<std::string> same_work(const Flags& flags, const ModelSpec& m) {
  constexpr std::int64_t kSteps = 10;
  const std::int64_t batch = flags.batches.front(), T = m.config.block_size;
  std::filesystem::create_directories(flags.same_work);
  const std::string path =
      flags.same_work + "/same-work-" + flags.model + "-v" + std::to_string(m.config.vocab_size) + ".h5";
  std::mt19937_64 rng(7);
  const Tensor xs = random_ids({kSteps, batch, T}, m.data_vocab, rng);
  const Tensor ys = random_ids({kSteps, batch, T}, m.data_vocab, rng);
  {
    // Written whole under another name and renamed, so that a reader never sees half.
    const std::string partial = path + ".partial";
    checkpoint::FileWriter out(partial);
    const nn::GPTConfig& c = m.config;
    for (const auto& [key, value] : std::vector<std::pair<const char*, std::int64_t>>{{"block_size", c.block_size},
                                                                                      {"vocab_size", c.vocab_size},
                                                                                      {"n_layer", c.n_layer},
                                                                                      {"n_head", c.n_head},
                                                                                      {"n_embd", c.n_embd},
                                                                                      {"steps", kSteps}})
      out.set_attribute("/", key, value);
    for (const auto& [key, value] : std::vector<std::pair<const char*, double>>{{"lr", kLr},
                                                                                {"beta1", kBeta1},
                                                                                {"beta2", kBeta2},
                                                                                {"eps", kEps},
                                                                                {"weight_decay", kWeightDecay},
                                                                                {"clip", kClip}})
      out.set_attribute("/", key, value);
    for (const auto& [name, value] : nn::GPT(m.config, 0).state_dict()) out.write_tensor("/init/" + name, value);
    out.write_tensor("/batches/x", xs);
    out.write_tensor("/batches/y", ys);
    out.close();
    std::filesystem::rename(partial, path);
  }
  std::vector<std::string> rows;
  for (const auto& precision : flags.precisions) {
    Trainer trainer(m.config, dtype_of(precision), device_of(flags));
    std::vector<double> losses;
    for (std::int64_t s = 0; s < kSteps; ++s)
      losses.push_back(trainer.step(xs.select(s), ys.select(s).to(device_of(flags))).item());
    rows.push_back("{\"case\": \"same work\", " + common_fields(flags, m, precision, batch) +
                   ", \"steps\": " + std::to_string(kSteps) + ", \"losses\": " + json_list(losses) + "}");
  }
  return rows;
}

// Each kind of layer of a GPT-2-small block, the loss and the head alone, on the
// step's shapes: one JSON line of milliseconds per call.
void time_ops(const Flags& flags, const ModelSpec& m, const std::string& precision, std::int64_t batch) {
  const DType dtype = dtype_of(precision);
  const std::int64_t T = m.config.block_size, N = batch * T, C = m.config.n_embd, V = m.config.vocab_size;
  const Device gpu = device_of(flags);
  tensor::Generator gen(0);
  const auto rows_of = [&](std::int64_t cols) { return tensor::normal({N, cols}, 0, 1, gen, dtype, gpu); };
  std::vector<std::pair<std::string, double>> times;
  const auto time = [&](const std::string& name, const std::function<void()>& f) {
    times.emplace_back(name, time_calls(flags, f, flags.steps).ms);
  };
  const auto forward_and_backward = [&](const std::string& name, nn::Module& layer, const Tensor& x, const Tensor& gy) {
    time(name + " forward", [&] { layer.forward(x); });
    time(name + " forward+backward", [&] {
      layer.forward(x);
      layer.backward(gy);
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
    const Tensor qkv = rows_of(3 * C).reshape({batch, T, 3 * C});
    time("attention forward", [&] { tensor::causal_attention_forward(qkv, m.config.n_head, 0.0, gen); });
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
    const Tensor ids = random_ids({batch, T}, m.data_vocab, rng);  // on the host, as the step passes them
    forward_and_backward("embedding [B, T] -> [B, T, C]", wte, ids,
                         tensor::normal({batch, T, C}, 0, 1, gen, dtype, gpu));
    const Tensor logits = rows_of(V), targets = random_ids({N}, m.data_vocab, rng).to(gpu);
    nn::CrossEntropyLoss loss;
    time("cross entropy [N, V] forward", [&] { loss.forward(logits, targets); });
    time("cross entropy [N, V] forward+backward", [&] {
      loss.forward(logits, targets);
      loss.backward();
    });
  }
  std::printf("{\"ops\": \"%s\", \"tf32\": %s, \"batch\": %lld, \"vocab\": %lld, \"ms_per_call\": {", precision.c_str(),
              flags.tf32 ? "true" : "false", static_cast<long long>(batch), static_cast<long long>(V));
  for (std::size_t i = 0; i < times.size(); ++i)
    std::printf("%s\"%s\": %.3f", i ? ", " : "", times[i].first.c_str(), times[i].second);
  std::printf("}}\n");
}

void empty_cache(const Flags& flags) {
  if (flags.device == "cuda") tensor::cuda_empty_cache();
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_main("gpu_gpt_bench", [&] {
    const Flags flags = parse_flags(argc, argv);
    TROUPE_CHECK(flags.device == "cpu" || tensor::cuda_available(), "gpu_gpt_bench: no CUDA device here");
    if (flags.device == "cuda") tensor::set_cuda_allow_tf32(flags.tf32);  // the host's products have no TF32
    const ModelSpec m = model_spec(flags);
    std::vector<std::string> rows;
    if (!flags.same_work.empty()) {
      rows = same_work(flags, m);
    } else {
      for (const std::int64_t batch : flags.batches)
        for (const auto& p : flags.precisions) {
          if (flags.ops) {
            time_ops(flags, m, p, batch);
          } else if (flags.breakdown) {
            time_step(flags, m, p, batch);
          } else {
            rows.push_back(time_attention(flags, m, p, batch));
            empty_cache(flags);
            rows.push_back(time_step(flags, m, p, batch));
          }
          empty_cache(flags);
        }
      if (flags.ops || flags.breakdown) return 0;
    }
    std::printf("[");
    for (std::size_t i = 0; i < rows.size(); ++i) std::printf("%s\n %s", i ? "," : "", rows[i].c_str());
    std::printf("\n]\n");
    return 0;
  });
}
