// tp_bench: a GPT training step split over the world by tensor parallelism
// (troupe/parallel/tensor_parallel.hpp), the world being the tp group: step time, the
// time its all-reduces kept the rank waiting, and the model state each rank holds.
//
//   mpirun -np K build/bench/tp_bench [--repeats N] [--steps S]
//
// The model is train_gpt's default preset (4 layers, 4 heads, C 128, T 128, Moby-Dick's
// 89 characters) at batch 16, dropout 0; the step is train_gpt's: forward, the
// vocabulary-parallel cross-entropy, backward, clipping at 1.0, AdamW. Timing: 3 warm-up
// steps, then --repeats repeats of --steps steps in wall time (the ranks wait for each
// other, so CPU time would count the polling), the lower median of the repeats per
// step. allreduce_ms: the communicator's wait time per step (Communicator::wait_time:
// time blocked on collectives not yet done). state_bytes: this rank's parameters,
// gradients and AdamW moments, from the tensors themselves; live_bytes: host memory
// live after a step with the model's activations released, beyond what was live before
// the model (the state plus the loss's cached logits and the batches; the one-rank model
// built to split from is gone by then). Output (rank 0), one JSON object:
//   {"tp": K, "params": N, "batch": B, "time": T, "step_ms": ..., "allreduce_ms": ...,
//    "state_bytes": ..., "live_bytes": ..., "repeats": [ms, ...], "loss": last loss}
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_main.hpp"
#include "troupe/collectives/communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/mpi/environment.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
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
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    TROUPE_CHECK(i + 1 < argc, "tp_bench: ", flag, " needs a value");
    const std::string value = argv[++i];
    if (flag == "--repeats")
      f.repeats = std::stoi(value);
    else if (flag == "--steps")
      f.steps = std::stoi(value);
    else
      throw InvalidArgument("tp_bench: unknown flag " + flag);
  }
  TROUPE_CHECK(f.repeats >= 1 && f.steps >= 1, "tp_bench: --repeats and --steps must be >= 1");
  return f;
}

Tensor random_ids(std::int64_t batch, std::int64_t time, std::int64_t vocab, tensor::Generator& gen) {
  const Tensor u = tensor::uniform({batch, time}, 0.0, static_cast<double>(vocab), gen, tensor::DType::f64);
  std::vector<std::int64_t> ids;
  for (double v : u.to_vector<double>()) ids.push_back(std::min<std::int64_t>(static_cast<std::int64_t>(v), vocab - 1));
  return Tensor::from_vector(ids, {batch, time});
}

double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  return bench::run_main("tp_bench", [&] {
    const Flags flags = parse_flags(argc, argv);
    tensor::set_num_threads(1);
    auto comm = collectives::world_communicator(collectives::options_from_environment());
    const nn::GPTConfig config{.block_size = 128, .vocab_size = 89, .n_layer = 4, .n_head = 4, .n_embd = 128};
    const std::int64_t batch = 16;
    const std::size_t before = tensor::host_memory_stats().live_bytes;
    auto model = parallel::tensor_parallel_gpt(config, 1337, *comm);
    nn::AdamW opt(model->named_parameters(), 1e-3, nn::Betas{0.9, 0.95}, 1e-8, 0.1);
    opt.set_weight_decay_filter(nn::decay_matrices_only);
    parallel::VocabParallelCrossEntropy loss_fn(*comm, config.vocab_size);
    tensor::Generator gen(1);
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int i = 0; i < 4; ++i) {
      Tensor x = random_ids(batch, config.block_size, config.vocab_size, gen);
      batches.emplace_back(x, random_ids(batch, config.block_size, config.vocab_size, gen));
    }
    std::size_t n = 0;
    double loss = 0;
    auto step = [&] {
      const auto& [x, y] = batches[n++ % batches.size()];
      opt.zero_grad();
      loss = loss_fn.forward(model->forward(x), y).item();
      model->backward(loss_fn.backward());
      parallel::tensor_parallel_clip_grad_norm(*model, 1.0, *comm);
      opt.step();
    };
    for (int i = 0; i < 3; ++i) step();
    model->release_activations();
    const std::size_t live_bytes = tensor::host_memory_stats().live_bytes - before;
    std::size_t state_bytes = 0;
    for (const nn::Parameter* p : model->parameters()) state_bytes += p->data.nbytes() + p->grad.nbytes();
    for (const auto& [key, value] : opt.state_dict())
      if (key.find('/') != std::string::npos) state_bytes += value.nbytes();
    std::vector<double> repeats;
    double waited = 0;
    for (int r = 0; r < flags.repeats; ++r) {
      comm->barrier();
      const auto wait0 = comm->wait_time();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < flags.steps; ++i) step();
      repeats.push_back(1e3 * seconds(std::chrono::steady_clock::now() - start) / flags.steps);
      waited += 1e3 * seconds(comm->wait_time() - wait0) / flags.steps;
    }
    TROUPE_CHECK(std::isfinite(loss), "tp_bench: the loss is not finite");
    if (comm->rank() == 0) {
      std::printf(
          "{\"tp\": %d, \"params\": %lld, \"batch\": %lld, \"time\": %lld, \"step_ms\": %.3f, \"allreduce_ms\": %.3f, "
          "\"state_bytes\": %zu, \"live_bytes\": %zu, \"repeats\": [",
          comm->size(), static_cast<long long>(nn::GPT(config, 1337).parameter_count()), static_cast<long long>(batch),
          static_cast<long long>(config.block_size), bench::lower_median(repeats), waited / flags.repeats, state_bytes,
          live_bytes);
      for (std::size_t i = 0; i < repeats.size(); ++i) std::printf("%s%.3f", i ? ", " : "", repeats[i]);
      std::printf("], \"loss\": %.6g}\n", loss);
    }
    return 0;
  });
}
