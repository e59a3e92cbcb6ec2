// mesh_bench: a GPT training step split over the world by tensor parallelism
// (troupe/parallel/tensor_parallel.hpp; the world is the tp group) or by pipeline
// parallelism (pipeline.hpp, --pp: the world is the pp group, or with --tp K a pp x tp
// mesh of world / K stages each split over K ranks): step time, the time the rank
// waited in collectives, the idle fraction of a pipeline stage, and the model state
// each rank holds.
//
//   mpirun -np K build/bench/mesh_bench [--repeats N] [--steps S] [--sequence-parallel]
//                                       [--pp [--tp K] --schedule gpipe|1f1b|interleaved|zero-bubble
//                                        --micro-batches M [--virtual-stages V]]
//
// The model is train_gpt's default preset (4 layers, 4 heads, C 128, T 128, Moby-Dick's
// 89 characters) at batch 16, dropout 0; the step is train_gpt's: forward, the
// vocabulary-parallel cross-entropy, backward, clipping at 1.0, AdamW. Timing: 3 warm-up
// steps, then --repeats repeats of --steps steps in wall time (the ranks wait for each
// other, so CPU time would count the polling), the lower median of the repeats per
// step. allreduce_ms: the communicator's wait time per step (Communicator::wait_time:
// time blocked on collectives not yet done); with --pp, idle: 1 - the stage's compute
// time / the step's wall time (PipelineStats), the mean over stages and a repeat's
// steps, the lower median of the repeats (as the step time, so one step slowed by the
// machine does not decide it; "idle_repeats" lists them all), beside
// the schedule's theoretical (p - 1) / (m + p - 1), or (p - 1) / (V m + p - 1) with V
// stages a rank (interleaved; V 2 unless given; zero-bubble is held to 1F1B's). With
// --pp, state_bytes is the most any rank holds. state_bytes: this rank's parameters,
// gradients and AdamW moments, from the tensors themselves; live_bytes: host memory
// live after a step with the model's activations released, beyond what was live before
// the model (the state plus the loss's cached logits and the batches; the one-rank model
// built to split from is gone by then); step_peak_bytes: the most host memory one step
// held beyond what was live before it (activations, gathered sequences, gradients
// being made), the worst rank's. --sequence-parallel: tp with Megatron's sequence
// parallelism. Output (rank 0), one JSON object:
//   {"tp": K, "pp": P, "schedule": S, "micro_batches": M, "params": N, "batch": B,
//    "time": T, "step_ms": ..., "allreduce_ms": ..., "idle": ..., "idle_theory": ...,
//    "state_bytes": ..., "live_bytes": ..., "step_peak_bytes": ..., "sequence_parallel": B,
//    "repeats": [ms, ...], "idle_repeats": [...], "loss": last loss}
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "random_ids.hpp"
#include "troupe/collectives/communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/mpi/environment.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/parallel/device_mesh.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/tensor_parallel.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using tensor::Tensor;

namespace {

struct Flags {
  int repeats = 5;
  int steps = 4;
  bool pp = false;
  bool sequence_parallel = false;  // without --pp: Megatron's sequence parallelism over the world
  int tp = 0;                      // with --pp: ranks per stage (0: 1); without, the world
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::one_f_one_b;
  int micro_batches = 8;
  int virtual_stages = 0;  // 0: 2 under interleaved, else 1
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--pp") {
      f.pp = true;
      continue;
    }
    if (flag == "--sequence-parallel") {
      f.sequence_parallel = true;
      continue;
    }
    TROUPE_CHECK(i + 1 < argc, "mesh_bench: ", flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--repeats")
      f.repeats = std::stoi(value);
    else if (flag == "--steps")
      f.steps = std::stoi(value);
    else if (flag == "--schedule")
      f.schedule = parallel::parse_pipeline_schedule(value);
    else if (flag == "--micro-batches")
      f.micro_batches = std::stoi(value);
    else if (flag == "--tp")
      f.tp = std::stoi(value);
    else if (flag == "--virtual-stages")
      f.virtual_stages = std::stoi(value);
    else
      throw InvalidArgument("mesh_bench: unknown flag " + flag);
  }
  TROUPE_CHECK(f.repeats >= 1 && f.steps >= 1 && f.micro_batches >= 1,
               "mesh_bench: --repeats, --steps and --micro-batches must be >= 1");
  TROUPE_CHECK(f.tp == 0 || (f.pp && f.tp >= 1), "mesh_bench: --tp goes with --pp, and must be >= 1");
  TROUPE_CHECK(!(f.pp && f.sequence_parallel), "mesh_bench: --sequence-parallel goes without --pp");
  if (f.virtual_stages == 0) f.virtual_stages = f.schedule == parallel::PipelineSchedule::interleaved ? 2 : 1;
  return f;
}

double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  return bench::run_main("mesh_bench", [&] {
    const Flags flags = parse_flags(argc, argv);
    tensor::set_num_threads(1);
    auto comm = collectives::world_communicator(collectives::options_from_environment());
    const nn::GPTConfig config{.block_size = 128, .vocab_size = 89, .n_layer = 4, .n_head = 4, .n_embd = 128};
    const std::int64_t batch = 16;
    const std::size_t before = tensor::host_memory_stats().live_bytes;
    // Either this rank's tp part of the model, or its pipeline stage (split over tp).
    const int tp_size = flags.pp ? std::max(flags.tp, 1) : comm->size();
    std::unique_ptr<parallel::DeviceMesh> mesh;
    if (flags.pp)
      mesh = std::make_unique<parallel::DeviceMesh>(*comm, std::vector<parallel::MeshDim>{{"pp", -1}, {"tp", tp_size}});
    collectives::Communicator& tp = flags.pp ? mesh->comm("tp") : *comm;
    collectives::Communicator& pp = flags.pp ? mesh->comm("pp") : *comm;
    std::unique_ptr<nn::Module> model;
    parallel::PipelineStage* stage = nullptr;
    if (flags.pp) {
      // This rank's stages of the model cut into p x V: rank, rank + p, ...
      const int p = pp.size(), v = flags.virtual_stages;
      std::vector<std::unique_ptr<parallel::PipelineStage>> chunks;
      for (int c = 0; c < v; ++c)
        chunks.push_back(
            std::make_unique<parallel::GptStage>(config, 1337, pp.rank() + c * p, p * v, tp_size > 1 ? &tp : nullptr));
      std::unique_ptr<parallel::PipelineStage> built =
          v == 1 ? std::move(chunks[0]) : std::make_unique<parallel::InterleavedStage>(std::move(chunks));
      stage = built.get();
      model = std::move(built);
    } else {
      auto gpt = parallel::tensor_parallel_gpt(config, 1337, tp);
      if (flags.sequence_parallel) parallel::enable_sequence_parallel(*gpt, tp);
      model = std::move(gpt);
    }
    nn::AdamW opt(model->named_parameters(), 1e-3, nn::Betas{0.9, 0.95}, 1e-8, 0.1);
    opt.set_weight_decay_filter(nn::decay_matrices_only);
    parallel::VocabParallelCrossEntropy tp_loss(tp, config.vocab_size);
    nn::CrossEntropyLoss ce;
    const parallel::PipelineLoss pipe_loss =
        tp_size > 1
            ? parallel::PipelineLoss{
                  [&tp_loss](const Tensor& out, const Tensor& y) { return tp_loss.forward(out, y).item(); },
                  [&tp_loss](double scale) { return tp_loss.backward(scale); }}
            : parallel::PipelineLoss{[&ce](const Tensor& out, const Tensor& y) { return ce.forward(out, y).item(); },
                                     [&ce](double scale) { return ce.backward(scale); }};
    std::unique_ptr<parallel::Pipeline> pipe;
    if (stage) {
      const std::vector<parallel::PipelineStage*> chunks = stage->chunks();
      pipe = std::make_unique<parallel::Pipeline>(std::vector<nn::Module*>(chunks.begin(), chunks.end()), pp,
                                                  flags.schedule, flags.micro_batches);
    }
    tensor::Generator gen(1);
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int i = 0; i < 4; ++i) {
      Tensor x = bench::random_ids(batch, config.block_size, config.vocab_size, gen);
      batches.emplace_back(x, bench::random_ids(batch, config.block_size, config.vocab_size, gen));
    }
    std::size_t n = 0;
    double loss = 0;
    std::int64_t forward_bytes = 0;  // what the last forward left live for backward (tp only)
    auto step = [&] {
      const auto& [x, y] = batches[n++ % batches.size()];
      opt.zero_grad();
      if (pipe) {
        loss = pipe->forward_backward(x, y, pipe_loss);
        stage->reduce_tied_gradient(pp);
        parallel::pipeline_clip_grad_norm(*stage, 1.0, pp, tp_size > 1 ? &tp : nullptr);
      } else {
        const auto before_forward = static_cast<std::int64_t>(tensor::host_memory_stats().live_bytes);
        loss = tp_loss.forward(model->forward(x), y).item();
        forward_bytes = static_cast<std::int64_t>(tensor::host_memory_stats().live_bytes) - before_forward;
        model->backward(tp_loss.backward());
        if (flags.sequence_parallel) parallel::sequence_parallel_sum_gradients(*model, tp);
        parallel::tensor_parallel_clip_grad_norm(*model, 1.0, tp);
      }
      opt.step();
      if (pipe) stage->broadcast_tied_table(pp);
    };
    for (int i = 0; i < 3; ++i) step();
    // The most one step holds beyond what was live before it (activations, gathered
    // sequences, gradients being made), and what its forward left for the backward: the
    // layers' caches of the last step dropped first. The worst rank's of each.
    model->release_activations();
    const std::size_t live_before_step = tensor::host_memory_stats().live_bytes;
    tensor::reset_host_memory_peak();
    step();
    std::int64_t step_peak_bytes =
        static_cast<std::int64_t>(tensor::host_memory_stats().peak_bytes) - static_cast<std::int64_t>(live_before_step);
    std::int64_t activation_bytes = forward_bytes;
    std::vector<std::int64_t> peaks{step_peak_bytes, activation_bytes};
    comm->allreduce(collectives::Buffer(peaks), collectives::ReduceOp::max);
    step_peak_bytes = peaks[0];
    activation_bytes = peaks[1];
    model->release_activations();
    std::size_t live_bytes = tensor::host_memory_stats().live_bytes - before;
    std::size_t state_bytes = 0;
    // A gradient for every parameter, as at the step's peak: the first stage's tied table
    // has one until reduce_tied_gradient sends it.
    for (const nn::Parameter* p : model->parameters()) state_bytes += 2 * p->data.nbytes();
    for (const auto& [key, value] : opt.state_dict())
      if (key.find('/') != std::string::npos) state_bytes += value.nbytes();
    if (pipe) {  // the worst rank's
      std::vector<std::int64_t> bytes{static_cast<std::int64_t>(state_bytes), static_cast<std::int64_t>(live_bytes)};
      comm->allreduce(collectives::Buffer(bytes), collectives::ReduceOp::max);
      state_bytes = static_cast<std::size_t>(bytes[0]);
      live_bytes = static_cast<std::size_t>(bytes[1]);
    }
    std::vector<double> repeats, idles;
    double waited = 0;
    for (int r = 0; r < flags.repeats; ++r) {
      comm->barrier();
      const auto wait0 = comm->wait_time();
      const auto start = std::chrono::steady_clock::now();
      double idle = 0;
      for (int i = 0; i < flags.steps; ++i) {
        step();
        if (pipe) idle += pipe->stats().idle_fraction();
      }
      idles.push_back(idle / flags.steps);
      repeats.push_back(1e3 * seconds(std::chrono::steady_clock::now() - start) / flags.steps);
      waited += 1e3 * seconds(comm->wait_time() - wait0) / flags.steps;
    }
    TROUPE_CHECK(std::isfinite(loss), "mesh_bench: the loss is not finite");
    comm->allreduce(collectives::Buffer(idles), collectives::ReduceOp::avg);  // the mean over stages
    const double idle = bench::lower_median(idles);
    const int p = pipe ? pp.size() : 1, m = flags.micro_batches, v = flags.virtual_stages;
    if (comm->rank() == 0) {
      std::printf(
          "{\"tp\": %d, \"pp\": %d, \"schedule\": \"%s\", \"micro_batches\": %d, \"params\": %lld, "
          "\"batch\": %lld, \"time\": %lld, \"step_ms\": %.3f, \"allreduce_ms\": %.3f, \"idle\": %.4f, "
          "\"idle_theory\": %.4f, \"state_bytes\": %zu, \"live_bytes\": %zu, \"step_peak_bytes\": %lld, "
          "\"activation_bytes\": %lld, \"virtual_stages\": %d, "
          "\"sequence_parallel\": %s, \"repeats\": [",
          tp_size, p, pipe ? parallel::pipeline_schedule_name(flags.schedule) : "none", pipe ? m : 1,
          static_cast<long long>(nn::GPT(config, 1337).parameter_count()), static_cast<long long>(batch),
          static_cast<long long>(config.block_size), bench::lower_median(repeats), waited / flags.repeats, idle,
          pipe ? double(p - 1) / (v * m + p - 1) : 0.0, state_bytes, live_bytes,
          static_cast<long long>(step_peak_bytes), static_cast<long long>(activation_bytes), v,
          flags.sequence_parallel ? "true" : "false");
      for (std::size_t i = 0; i < repeats.size(); ++i) std::printf("%s%.3f", i ? ", " : "", repeats[i]);
      std::printf("], \"idle_repeats\": [");
      for (std::size_t i = 0; i < idles.size(); ++i) std::printf("%s%.4f", i ? ", " : "", idles[i]);
      std::printf("], \"loss\": %.6g}\n", loss);
    }
    return 0;
  });
}
