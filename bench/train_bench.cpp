// train_bench: one full training step of an MLP with troupe's nn module, in samples/s.
//
//   build/bench/train_bench [--hidden N]... [--batch N] [--repeats N] [--min-time S]
//
// A step is what examples/train_digits.cpp does per batch: zero_grad, forward,
// cross-entropy, backward, SGD with momentum. The model is the digits MLP,
// 64-H-H-10 with ReLU (H = 256 by default, and 512), on random inputs in [0, 1) and
// random labels, one thread.
//
// The baseline is bench/torch_train_step.py: the same model, batch, optimizer and
// data in PyTorch eager, timed the same way and printing the same JSON. They are two
// programs (a C++ one cannot host PyTorch without libtorch, which Debian does not
// ship), so bench/run runs them one after the other in each of its rounds and pairs
// them by model there. Keep the two files in step.
//
// Timing, identical on both sides: 16 batches are made once and cycled (a fixed
// batch would be memorised within a few hundred steps and drive the gradients
// towards zero); 20 warm-up steps run untimed, the last 10 of them sizing a repeat
// to about --min-time; then --repeats repeats, each timed in process CPU time (as
// tensor_bench does, so that another process on a shared machine is not charged to
// whichever program is running, while a helper thread of our own would be). The
// median repeat is reported.
//
// Output, one JSON object per model on stdout, as a list:
//   {"model": "64-256-256-10", "batch": 64, "samples_per_s": ..., "step_us": ...,
//    "repeats": [samples/s, ...], "steps_per_repeat": N, "loss": last loss}
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "troupe/error.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using bench::cpu_seconds;

namespace {

struct Flags {
  std::vector<std::int64_t> hidden;  // one model per entry; {256, 512} when none is given
  std::int64_t batch = 64;
  int repeats = 5;
  double min_time = 0.2;  // seconds per repeat
};

constexpr std::int64_t kInputs = 64, kClasses = 10;
constexpr int kBatches = 16, kWarmupSteps = 20;
constexpr double kLr = 0.05, kMomentum = 0.9;  // train_digits' defaults

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw InvalidArgument("train_bench: " + flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (flag == "--hidden")
        f.hidden.push_back(std::stoll(value));
      else if (flag == "--batch")
        f.batch = std::stoll(value);
      else if (flag == "--repeats")
        f.repeats = std::stoi(value);
      else if (flag == "--min-time")
        f.min_time = std::stod(value);
      else
        throw InvalidArgument("train_bench: unknown flag " + flag);
    } catch (const std::logic_error&) {  // stoll/stod: not a number, or out of range
      throw InvalidArgument("train_bench: bad value '" + value + "' for " + flag);
    }
  }
  if (f.hidden.empty()) f.hidden = {256, 512};
  for (auto h : f.hidden)
    if (h < 1) throw InvalidArgument("train_bench: --hidden must be >= 1, got " + std::to_string(h));
  if (f.batch < 1 || f.repeats < 1 || !(f.min_time > 0))
    throw InvalidArgument("train_bench: --batch and --repeats must be >= 1 and --min-time > 0");
  return f;
}

struct Batch {
  tensor::Tensor inputs, labels;
};

std::vector<Batch> random_batches(std::int64_t batch, tensor::Generator& gen) {
  std::mt19937_64 label_rng(1);
  std::vector<Batch> out;
  for (int b = 0; b < kBatches; ++b) {
    tensor::Tensor labels = tensor::Tensor::empty({batch}, tensor::DType::i64);
    for (std::int64_t i = 0; i < batch; ++i)
      labels.data<std::int64_t>()[i] = static_cast<std::int64_t>(label_rng() % kClasses);
    out.push_back({tensor::uniform({batch, kInputs}, 0, 1, gen), labels});
  }
  return out;
}

struct Result {
  std::string model;
  std::vector<double> repeats;  // samples/s
  std::int64_t steps_per_repeat = 0;
  double loss = 0;
};

Result time_model(std::int64_t hidden, const Flags& flags) {
  tensor::Generator gen(0);
  nn::Sequential model;
  model.emplace<nn::Linear>(kInputs, hidden, gen);
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(hidden, hidden, gen);
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(hidden, kClasses, gen);
  nn::SGD optimizer(model.named_parameters(), kLr, kMomentum);
  nn::CrossEntropyLoss loss_fn;
  const std::vector<Batch> batches = random_batches(flags.batch, gen);

  std::int64_t step_count = 0;
  tensor::Tensor loss;
  auto step = [&] {
    const Batch& b = batches[static_cast<std::size_t>(step_count++ % kBatches)];
    optimizer.zero_grad();
    const tensor::Tensor logits = model.forward(b.inputs);
    loss = loss_fn.forward(logits, b.labels);
    model.backward(loss_fn.backward());
    optimizer.step();
  };

  // The first steps allocate the momentum buffers and fault in fresh pages: size the
  // repeats on the second half of the warm-up only.
  for (int i = 0; i < kWarmupSteps / 2; ++i) step();
  const double sizing_start = cpu_seconds();
  for (int i = kWarmupSteps / 2; i < kWarmupSteps; ++i) step();
  const double per_step = (cpu_seconds() - sizing_start) / (kWarmupSteps - kWarmupSteps / 2);

  Result r;
  r.model = std::to_string(kInputs) + "-" + std::to_string(hidden) + "-" + std::to_string(hidden) + "-" +
            std::to_string(kClasses);
  r.steps_per_repeat = std::max<std::int64_t>(10, static_cast<std::int64_t>(flags.min_time / std::max(per_step, 1e-9)));
  for (int rep = 0; rep < flags.repeats; ++rep) {
    const double start = cpu_seconds();
    for (std::int64_t i = 0; i < r.steps_per_repeat; ++i) step();
    const double seconds = cpu_seconds() - start;
    r.repeats.push_back(static_cast<double>(flags.batch * r.steps_per_repeat) / seconds);
  }
  r.loss = loss.item();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_main("train_bench", [&] {
    const Flags flags = parse_flags(argc, argv);
    tensor::set_num_threads(1);
    std::printf("[");
    for (std::size_t m = 0; m < flags.hidden.size(); ++m) {
      const Result r = time_model(flags.hidden[m], flags);
      const double samples_per_s = bench::lower_median(r.repeats);
      if (!std::isfinite(r.loss)) throw Error("train_bench: the loss of " + r.model + " is not finite");
      std::printf(
          "%s\n {\"model\": \"%s\", \"batch\": %lld, \"samples_per_s\": %.1f, \"step_us\": %.2f, \"repeats\": [",
          m ? "," : "", r.model.c_str(), static_cast<long long>(flags.batch), samples_per_s,
          1e6 * static_cast<double>(flags.batch) / samples_per_s);
      for (std::size_t i = 0; i < r.repeats.size(); ++i) std::printf("%s%.1f", i ? ", " : "", r.repeats[i]);
      std::printf("], \"steps_per_repeat\": %lld, \"loss\": %.6g}", static_cast<long long>(r.steps_per_repeat), r.loss);
      std::fflush(stdout);
    }
    std::printf("\n]\n");
    return 0;
  });
}
