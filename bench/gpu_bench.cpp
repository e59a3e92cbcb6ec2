// gpu_bench: issue 11's GPU figures, on one CUDA device.
//
//   mpirun -np 1 build/bench/gpu_bench [--model mlp25m|deep67m]... [--precision f32|bf16]...
//                                      [--batch N] [--repeats N] [--steps N]
//
// 1. The training step of bench/torch_gpu_step.py -- zero_grad, forward, cross-entropy,
//    backward, Adam (lr 1e-3) -- on the same models (mlp25m 1024-4096-4096-1024,
//    deep67m 16 x Linear(2048, 2048), ReLU between), batch and data (8 resident
//    batches, inputs uniform in [0, 1), labels uniform over the output width), in
//    troupe's nn on CUDA, twice: the plain model ("plain", what PyTorch eager runs)
//    and wrapped in DistributedDataParallel over an NCCL communicator of this one rank
//    ("ddp-nccl": gradient buckets, the all-reduce on NCCL's stream after an event).
//    bf16 is troupe's mixed precision: a bf16 model (cuBLAS bf16 products with f32
//    accumulation) stepping f32 master weights (train/master_weights.hpp), against
//    PyTorch's autocast, which keeps f32 weights and casts them for each product.
// 2. Fused Adam over 100M f32 parameters (one kernel) against a device-to-device copy
//    of 100M f32 in the same run, in bytes moved per second: Adam reads param, grad,
//    exp_avg, exp_avg_sq and writes three back (28 bytes an element), a copy reads
//    and writes one (8).
//
// Timing: 20 warm-up steps, then --repeats repeats of --steps steps between two
// device synchronisations (wall time, so launch gaps count, as they do between
// PyTorch's CUDA events); the median repeat is reported. Output: one JSON object.
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
#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/collectives/nccl_communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/mpi/environment.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adam.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/master_weights.hpp"
#include "troupe/tensor/cuda_memory.hpp"  // cuda_empty_cache
#include "troupe/tensor/fused_optim.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using tensor::Device;
using tensor::DType;
using tensor::Tensor;

namespace {

struct Flags {
  std::vector<std::string> models, precisions;
  std::int64_t batch = 256;
  int repeats = 5, steps = 20;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw InvalidArgument("gpu_bench: " + flag + " needs a value");
    const std::string value = argv[++i];
    try {
      if (flag == "--model")
        f.models.push_back(value);
      else if (flag == "--precision")
        f.precisions.push_back(value);
      else if (flag == "--batch")
        f.batch = std::stoll(value);
      else if (flag == "--repeats")
        f.repeats = std::stoi(value);
      else if (flag == "--steps")
        f.steps = std::stoi(value);
      else
        throw InvalidArgument("gpu_bench: unknown flag " + flag);
    } catch (const std::logic_error&) {
      throw InvalidArgument("gpu_bench: bad value '" + value + "' for " + flag);
    }
  }
  if (f.models.empty()) f.models = {"mlp25m", "deep67m"};
  if (f.precisions.empty()) f.precisions = {"f32", "bf16"};
  for (const auto& p : f.precisions)
    if (p != "f32" && p != "bf16") throw InvalidArgument("gpu_bench: --precision is f32 or bf16, got " + p);
  if (f.batch < 1 || f.repeats < 1 || f.steps < 1)
    throw InvalidArgument("gpu_bench: --batch, --repeats and --steps must be >= 1");
  return f;
}

std::vector<std::int64_t> widths_of(const std::string& model) {
  if (model == "mlp25m") return {1024, 4096, 4096, 1024};
  if (model == "deep67m") return std::vector<std::int64_t>(17, 2048);
  throw InvalidArgument("gpu_bench: unknown model " + model + " (mlp25m, deep67m)");
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The median of `repeats` timings of `steps` calls of f, in seconds per call.
double median_seconds_per_call(const std::function<void()>& f, int warmup, int repeats, int steps) {
  for (int i = 0; i < warmup; ++i) f();
  tensor::cuda_synchronize();
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) f();
    tensor::cuda_synchronize();
    times.push_back(seconds_since(start) / steps);
  }
  std::sort(times.begin(), times.end());
  return times[(times.size() - 1) / 2];  // the lower median, as torch_gpu_step.py's median_low
}

struct StepResult {
  double step_ms = 0, loss = 0;
  std::int64_t params = 0;
};

StepResult time_step(const std::string& model_name, const std::string& precision, bool with_ddp,
                     collectives::Communicator* nccl, const Flags& flags) {
  const Device gpu = Device::cuda();
  const std::vector<std::int64_t> widths = widths_of(model_name);
  tensor::Generator gen(0);
  nn::Sequential model;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    model.emplace<nn::Linear>(widths[i], widths[i + 1], gen);
    if (i + 2 < widths.size()) model.emplace<nn::ReLU>();
  }
  const bool bf16 = precision == "bf16";
  if (bf16) model.to(DType::bf16);
  model.to(gpu);
  std::unique_ptr<parallel::MasterWeights> master = bf16 ? std::make_unique<parallel::MasterWeights>(model) : nullptr;
  nn::Adam optimizer(bf16 ? master->named_parameters() : model.named_parameters(), 1e-3);
  std::unique_ptr<parallel::DistributedDataParallel> ddp =
      with_ddp ? std::make_unique<parallel::DistributedDataParallel>(model, *nccl) : nullptr;
  nn::CrossEntropyLoss loss_fn;

  struct Batch {
    Tensor x, y;
  };
  std::vector<Batch> batches;
  std::mt19937_64 rng(1);
  for (int b = 0; b < 8; ++b) {
    Tensor y = Tensor::empty({flags.batch}, DType::i64);
    for (std::int64_t i = 0; i < flags.batch; ++i)
      y.data<std::int64_t>()[i] = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(widths.back()));
    batches.push_back(
        {tensor::uniform({flags.batch, widths.front()}, 0, 1, gen, bf16 ? DType::bf16 : DType::f32, gpu), y.to(gpu)});
  }

  std::int64_t count = 0;
  Tensor loss;
  auto step = [&] {
    const Batch& b = batches[static_cast<std::size_t>(count++ % 8)];
    model.zero_grad();
    loss = loss_fn.forward(ddp ? ddp->forward(b.x) : model.forward(b.x), b.y);
    if (ddp)
      ddp->backward(loss_fn.backward());
    else
      model.backward(loss_fn.backward());
    if (master) master->copy_gradients_to_master();
    optimizer.step();
    if (master) master->copy_master_to_model();
  };
  StepResult r;
  r.step_ms = 1e3 * median_seconds_per_call(step, 20, flags.repeats, flags.steps);
  r.loss = loss.item();
  for (const auto& p : model.named_parameters()) r.params += p.param->data.numel();
  if (!std::isfinite(r.loss)) throw Error("gpu_bench: the loss of " + model_name + " " + precision + " is not finite");
  return r;
}

// Fused Adam over n f32 parameters against a device-to-device copy of n f32.
void print_adam_bandwidth() {
  constexpr std::int64_t n = 100'000'000;
  const Device gpu = Device::cuda();
  Tensor param = Tensor::zeros({n}, DType::f32, gpu), grad = Tensor::full({n}, 0.5, DType::f32, gpu);
  Tensor m = Tensor::zeros({n}, DType::f32, gpu), v = Tensor::zeros({n}, DType::f32, gpu);
  Tensor copy = Tensor::empty({n}, DType::f32, gpu);
  std::int64_t step = 0;
  const double adam = median_seconds_per_call(
      [&] { tensor::fused_adam_step_(param, grad, m, v, tensor::AdamStep{.step = ++step}); }, 3, 9, 5);
  const double copied = median_seconds_per_call([&] { copy.copy_(grad); }, 3, 9, 5);
  std::printf(" \"adam_100m\": {\"adam_ms\": %.4f, \"adam_GBps\": %.1f, \"copy_ms\": %.4f, \"copy_GBps\": %.1f},\n",
              adam * 1e3, 28.0 * n / adam / 1e9, copied * 1e3, 8.0 * n / copied / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  return bench::run_main("gpu_bench", [&] {
    const Flags flags = parse_flags(argc, argv);
    mpi::Environment env(&argc, &argv);
    TROUPE_CHECK(tensor::cuda_available(), "gpu_bench: no CUDA device here");
    collectives::MpiCommunicator bootstrap;
    collectives::NcclCommunicator nccl(bootstrap);
    std::printf("{\n");
    print_adam_bandwidth();
    std::printf(" \"steps\": [");
    bool first = true;
    for (const auto& model : flags.models) {
      for (const auto& precision : flags.precisions) {
        for (bool with_ddp : {false, true}) {
          const StepResult r = time_step(model, precision, with_ddp, &nccl, flags);
          std::printf(
              "%s\n  {\"model\": \"%s\", \"precision\": \"%s\", \"wrapper\": \"%s\", \"batch\": %lld, "
              "\"params\": %lld, \"step_ms\": %.4f, \"loss\": %.6g}",
              first ? "" : ",", model.c_str(), precision.c_str(), with_ddp ? "ddp-nccl" : "plain",
              static_cast<long long>(flags.batch), static_cast<long long>(r.params), r.step_ms, r.loss);
          std::fflush(stdout);
          first = false;
          tensor::cuda_empty_cache();
        }
      }
    }
    std::printf("\n ]\n}\n");
    return 0;
  });
}
