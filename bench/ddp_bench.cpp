// ddp_bench: data-parallel training steps with troupe::parallel::DistributedDataParallel,
// in samples/s over all ranks, with how much of the gradient all-reduce was hidden
// behind backward. Run it under mpirun at 1 and 2 ranks (bench/run's `train` area
// does), next to bench/torch_ddp.py, PyTorch DDP (gloo) on the same models and batches.
//
//   mpirun -np 2 build/bench/ddp_bench [--model digits|large]... [--steps N] [--repeats N]
//
// Models, one compute thread per rank, SGD with momentum, cross-entropy:
//   digits  64-512-512-10,          batch 64 per rank (the digits MLP)
//   large   1024-4096-4096-1024,    batch 32 per rank (25.2M parameters, 100 MB of
//           f32 gradients per step: communication matters)
//
// Timing: 16 random batches cycled; warm-up steps untimed; then --repeats repeats of
// --steps steps each, wall clock on rank 0 between barriers (waiting for peers is
// part of a step); the median repeat is reported. Hidden fraction: DDP records the
// time it waited for all-reduces after backward's compute ended (exposed); the same
// buckets all-reduced alone, blocking, give the full communication time; hidden =
// 1 - exposed / full.
//
// Output (rank 0), a JSON list, one object per model:
//   {"model": "...", "ranks": 2, "batch_per_rank": 32, "samples_per_s": ..., "step_ms": ...,
//    "exposed_ms": ..., "allreduce_ms": ..., "hidden": 0.9, "repeats": [...], "loss": ...}
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/mpi/environment.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using Clock = std::chrono::steady_clock;

namespace {

struct ModelSpec {
  std::string name;
  std::vector<std::int64_t> widths;  // input, hidden..., classes
  std::int64_t batch;                // per rank
};

const std::vector<ModelSpec> kModels = {
    {"digits", {64, 512, 512, 10}, 64},
    {"large", {1024, 4096, 4096, 1024}, 32},
};

struct Flags {
  std::vector<std::string> models;
  int steps = 0;  // 0: per model default
  int repeats = 5;
  double bucket_mb = 25;
  bool progress_thread = true;  // the communicator's own progress thread
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw InvalidArgument("ddp_bench: " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model")
      f.models.push_back(value);
    else if (flag == "--steps")
      f.steps = std::stoi(value);
    else if (flag == "--repeats")
      f.repeats = std::stoi(value);
    else if (flag == "--bucket-mb")
      f.bucket_mb = std::stod(value);
    else if (flag == "--progress-thread")
      f.progress_thread = value != "0";
    else
      throw InvalidArgument("ddp_bench: unknown flag " + flag);
  }
  if (f.models.empty()) f.models = {"digits", "large"};
  return f;
}

std::string model_label(const ModelSpec& spec) {
  std::string s;
  for (auto w : spec.widths) {
    if (!s.empty()) s += '-';
    s += std::to_string(w);  // not "-" + to_string(w): GCC 12's -Wrestrict misfires on it
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

std::string run_model(const ModelSpec& spec, const Flags& flags, collectives::Communicator& comm) {
  tensor::Generator gen(0);
  nn::Sequential model;
  for (std::size_t l = 0; l + 1 < spec.widths.size(); ++l) {
    model.emplace<nn::Linear>(spec.widths[l], spec.widths[l + 1], gen);
    if (l + 2 < spec.widths.size()) model.emplace<nn::ReLU>();
  }
  parallel::DistributedDataParallel ddp(model, comm,
                                        {.bucket_bytes = static_cast<std::size_t>(flags.bucket_mb * 1024 * 1024)});
  nn::SGD sgd(model.named_parameters(), 0.01, 0.9);
  nn::CrossEntropyLoss loss_fn;

  // Each rank its own data (as DDP would get from a sampler).
  tensor::Generator data_gen(100 + static_cast<std::uint64_t>(comm.rank()));
  std::mt19937_64 label_rng(7 + static_cast<std::uint64_t>(comm.rank()));
  const std::int64_t classes = spec.widths.back();
  std::vector<std::pair<Tensor, Tensor>> batches;
  for (int b = 0; b < 16; ++b) {
    Tensor labels = Tensor::empty({spec.batch}, DType::i64);
    for (std::int64_t i = 0; i < spec.batch; ++i)
      labels.data<std::int64_t>()[i] = static_cast<std::int64_t>(label_rng() % static_cast<std::uint64_t>(classes));
    batches.emplace_back(tensor::uniform({spec.batch, spec.widths.front()}, 0, 1, data_gen), labels);
  }

  std::size_t next = 0;
  double exposed = 0, loss = 0;
  auto step = [&] {
    const auto& [x, y] = batches[next++ % batches.size()];
    sgd.zero_grad();
    loss = loss_fn.forward(ddp.forward(x), y).item();
    ddp.backward(loss_fn.backward());
    exposed += ddp.last_sync_stats().wait_seconds;
    sgd.step();
  };
  const bool large = spec.widths[1] >= 1024;
  const int steps = flags.steps > 0 ? flags.steps : (large ? 8 : 200);
  for (int i = 0; i < (large ? 3 : 30); ++i) step();

  std::vector<double> repeats;
  exposed = 0;
  for (int r = 0; r < flags.repeats; ++r) {
    comm.barrier();
    const auto start = Clock::now();
    for (int i = 0; i < steps; ++i) step();
    comm.barrier();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    repeats.push_back(static_cast<double>(spec.batch * comm.size() * steps) / seconds);
  }
  const double exposed_ms = 1e3 * exposed / (steps * flags.repeats);

  // The same buckets, all-reduced alone and blocking: the communication to hide.
  std::vector<Tensor> buckets;
  for (const auto& names : ddp.bucket_parameter_names()) {
    std::int64_t n = 0;
    for (const auto& [name, p] : model.named_parameters())
      if (std::find(names.begin(), names.end(), name) != names.end()) n += p->data.numel();
    buckets.push_back(Tensor::ones({n}));
  }
  std::vector<double> comm_times;
  for (int r = 0; r < (large ? 5 : 20); ++r) {
    comm.barrier();
    const auto start = Clock::now();
    for (auto& b : buckets) comm.allreduce(collectives::Buffer(b), collectives::ReduceOp::avg);
    comm_times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  const double allreduce_ms = 1e3 * median(comm_times);
  const double hidden = comm.size() > 1 && allreduce_ms > 0 ? std::clamp(1 - exposed_ms / allreduce_ms, 0.0, 1.0) : 1.0;

  const double rate = median(repeats);
  char text[512];
  std::snprintf(text, sizeof text,
                "{\"model\": \"%s\", \"ranks\": %d, \"batch_per_rank\": %lld, \"samples_per_s\": %.1f, "
                "\"step_ms\": %.3f, \"exposed_ms\": %.3f, \"allreduce_ms\": %.3f, \"hidden\": %.3f, "
                "\"buckets\": %zu, \"loss\": %.6g, \"repeats\": [",
                model_label(spec).c_str(), comm.size(), static_cast<long long>(spec.batch), rate,
                1e3 * static_cast<double>(spec.batch * comm.size()) / rate, exposed_ms, allreduce_ms, hidden,
                buckets.size(), loss);
  std::string out = text;
  for (std::size_t i = 0; i < repeats.size(); ++i) out += (i ? ", " : "") + std::to_string(repeats[i]);
  return out + "]}";
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  int status = 0;
  try {
    const Flags flags = parse_flags(argc, argv);
    tensor::set_num_threads(1);
    collectives::Options options = collectives::options_from_environment();
    options.progress_thread = flags.progress_thread;
    auto comm = collectives::world_communicator(options);
    std::string json = "[";
    for (const auto& name : flags.models) {
      auto it = std::find_if(kModels.begin(), kModels.end(), [&](const ModelSpec& m) { return m.name == name; });
      if (it == kModels.end()) throw InvalidArgument("ddp_bench: unknown model " + name + " (digits, large)");
      json += (json.size() > 1 ? ",\n " : "\n ") + run_model(*it, flags, *comm);
    }
    if (comm->rank() == 0) std::printf("%s\n]\n", json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_bench: error: %s\n", e.what());
    status = 1;
  }
  return status;
}
