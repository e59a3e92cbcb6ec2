// sharding_bench: one sharding mode (ddp, zero1, zero2, fsdp) training one model with
// AdamW under mpirun: samples/s, the per-rank model-state bytes next to the ZeRO
// formula, and peak RSS; optionally (fsdp) the peak-RSS growth of a full-state-dict
// save through the parallel checkpoint. bench/run's `sharding` area runs it at 1, 2
// and 4 ranks for every mode, next to bench/torch_zero.py (PyTorch's
// ZeroRedundancyOptimizer on the same model).
//
//   mpirun -np 4 --oversubscribe build/bench/sharding_bench --model mlp25m|deep67m
//          --mode ddp|zero1|zero2|fsdp [--steps N] [--warmup N] [--save DIR [--save-rounds N]]
//          [--backward-prefetch pre|post]   (zero2, fsdp: FsdpOptions::backward_prefetch)
//          [--init cpu|meta] [--resume FILE]
//
// Models (ReLU between layers, cross-entropy over the last width, batch 32 per rank,
// one compute thread per rank, AdamW lr 1e-3, 25 MB buckets):
//   mlp25m   1024-4096-4096-1024       (25.2M parameters)
//   deep67m  16 x Linear(2048, 2048)   (67.1M parameters)
//   gpt124m  GPT-2 small (nn::GPT: 12 x 768, vocabulary 50257, context 1024; 124.4M
//            parameters), batch 1 x 128 tokens per rank, a unit per Block
// zero2 and fsdp wrap each Linear as a unit (the worker group's default policy) and
// differ in FsdpOptions::sharding_strategy (shard_grad_op, full_shard), as the worker
// group's modes do.
//
// Timing: --warmup untimed steps, then --steps steps each timed on rank 0 between
// barriers (a step is zero-grad'ed forward, backward, optimizer step); samples/s is
// batch x ranks / the median step. A step of the 67M model at 4 ranks on 2 cores takes
// seconds, so step counts are small and the median is over the steps, not over runs.
//
// Memory, measured after one more backward (the moment gradients and optimizer state
// both exist), as the sum of the bytes of the live tensors each mode holds on this
// rank -- there is no host allocation counter in tensor/ (the caching allocator's is
// CUDA's) -- through the wrappers' own accessors:
//   parameters  the module's parameters (zero2: the full flat buffers the module's
//               tensors view, its shards being blocks of them; fsdp: the rank's flat
//               shards) -- FullyShardedDataParallel::parameter_bytes()
//   gradients   ddp/zero1: every grad (views into DDP's buckets, i.e. the buckets);
//               zero2/fsdp: the shard gradients
//   optimizer   the per-parameter state tensors (Adam's two moments and step counts)
// zero2 and fsdp also report the most bytes of gathered units and full gradients that
// existed at once during the last forward + backward (FsdpStats::peak_gathered_bytes;
// zero2's include its full parameters) and the largest unit's gathered bytes (the
// issue's "16N/W plus one unit's gathered parameters and the bucket": a unit's
// parameters and, as many bytes again, its flat gradient).
// Peak RSS is VmHWM from /proc/self/status, reset (clear_refs 5) once the wrapper is
// built -- so it covers training, not building the full model before fsdp shards it --
// and read before the byte accounting (optimizer state_dict() clones the state).
//
// Save (--save DIR, fsdp only): after training, every rank hands its local slices of
// the full model and optimizer state dicts (FullyShardedDataParallel::
// local_model_slices / local_optimizer_slices: views, no gathering) to
// checkpoint::ParallelCheckpoint; the peak RSS growth during a first save() is VmHWM
// (reset just before) minus VmRSS before, against the bound: the rank's shard
// (the bytes of its slices) + the largest tensor + 64 MB. Then --save-rounds (5) more
// synchronous saves (the median time is reported) and as many through
// ParallelCheckpoint::save_async, interleaved: the median time the caller is blocked
// (the snapshot of its slices, the worst rank; the first save's too, which allocates
// the snapshot buffer) and until the file is committed.
//
// Construction (every run): the peak of live tensor bytes (tensor::host_memory_stats)
// and the VmHWM growth from before the model is built until the wrapper is, with the
// model built on the CPU (--init cpu, every rank holds it whole) or described on the
// meta device (--init meta: zero2/fsdp materialise only what the rank keeps; ddp and
// zero1 materialise it whole).
//
// Resume (--resume FILE, fsdp), a process of its own as a restart is: the model is
// described on the meta device, wrapped, and loaded from FILE (a --save run's) by the
// sharded resume (each rank verifies its share of the checksums and reads only its
// slices: FullyShardedDataParallel::load_local_slices through train::SectionSlices);
// its peak live tensor bytes and VmHWM growth from before construction to the end of
// the load, and a hash of the loaded model and optimizer state, which equals the
// saving run's "state_hash" when the resume is exact. No training is timed. The
// issue's bound for both construction and resume: 1.2 x 16N/W + the largest unit.
//
// Output (rank 0): one JSON object; byte counts and RSS are the largest over ranks.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <mpi.h>

#include "sharding_trainer.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/parallel_checkpoint.hpp"
#include "troupe/checkpoint/section.hpp"
#include "troupe/collectives/communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/mpi/environment.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/parallel/ddp.hpp"
#include "troupe/parallel/fsdp.hpp"
#include "troupe/parallel/oss.hpp"
#include "troupe/parallel/sharded_model.hpp"
#include "troupe/peak_rss.hpp"
#include "troupe/tensor/host_memory.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/training_checkpoint.hpp"

using namespace troupe;
using Clock = std::chrono::steady_clock;
using namespace troupe::sharding_bench;

namespace {

constexpr std::int64_t kBatch = 32;  // per rank

struct Flags {
  std::string model = "mlp25m";
  parallel::Sharding mode = parallel::Sharding::ddp;
  int steps = 5;
  int warmup = 2;
  std::string save_dir;  // empty: no save
  int save_rounds = 5;   // timed saves of each kind (synchronous, background)
  bool init_meta = false;
  std::string resume_file;  // --resume: load it instead of training
  parallel::FsdpOptions::BackwardPrefetch backward_prefetch = parallel::FsdpOptions{}.backward_prefetch;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw InvalidArgument("sharding_bench: " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model")
      f.model = value;
    else if (flag == "--mode")
      f.mode = parallel::parse_sharding(value);
    else if (flag == "--steps")
      f.steps = std::stoi(value);
    else if (flag == "--warmup")
      f.warmup = std::stoi(value);
    else if (flag == "--save")
      f.save_dir = value;
    else if (flag == "--save-rounds")
      f.save_rounds = std::stoi(value);
    else if (flag == "--resume")
      f.resume_file = value;
    else if (flag == "--init" && (value == "cpu" || value == "meta"))
      f.init_meta = value == "meta";
    else if (flag == "--init")
      throw InvalidArgument("sharding_bench: --init is cpu or meta, got " + value);
    else if (flag == "--backward-prefetch" && (value == "pre" || value == "post"))
      f.backward_prefetch = value == "pre" ? parallel::FsdpOptions::BackwardPrefetch::backward_pre
                                           : parallel::FsdpOptions::BackwardPrefetch::backward_post;
    else if (flag == "--backward-prefetch")
      throw InvalidArgument("sharding_bench: --backward-prefetch is pre or post, got " + value);
    else
      throw InvalidArgument("sharding_bench: unknown flag " + flag);
  }
  if (f.steps < 1) throw InvalidArgument("sharding_bench: --steps must be >= 1");
  if (f.save_rounds < 1) throw InvalidArgument("sharding_bench: --save-rounds must be >= 1");
  if (!f.save_dir.empty() && f.mode != parallel::Sharding::fsdp)
    throw InvalidArgument("sharding_bench: --save is the fsdp full-state-dict save; use --mode fsdp");
  if (!f.resume_file.empty() && f.mode != parallel::Sharding::fsdp)
    throw InvalidArgument("sharding_bench: --resume is the fsdp sharded resume; use --mode fsdp");
  return f;
}

// The fsdp save: returns the JSON fields, e.g. "\"save\": {...}".
std::string save_full_state(parallel::FullyShardedDataParallel& fsdp, collectives::Communicator& comm,
                            const std::string& dir, int rounds, std::filesystem::path& file) {
  checkpoint::SaveManifest manifest;
  manifest.world_size = comm.size();
  manifest.groups = {"/model", "/optimizer"};
  for (const auto& [key, value] : fsdp.optimizer().state_dict())  // lr, step, hyper-parameters
    if (key.find('/') == std::string::npos)
      manifest.attributes.push_back({"/optimizer", key, checkpoint::detail::scalar_value(value)});
  std::vector<checkpoint::Slice> slices;
  std::int64_t shard = 0, largest = 0, total = 0;
  for (const auto& group : {std::pair{std::string("/model/"), fsdp.local_model_slices()},
                            std::pair{std::string("/optimizer/"), fsdp.local_optimizer_slices()}})
    for (const auto& piece : group.second) {
      manifest.add_tensor(group.first + piece.name, piece.dtype, piece.shape);
      slices.push_back(checkpoint::Slice{piece.begin, piece.data});
      std::int64_t numel = 1;
      for (auto d : piece.shape) numel *= d;
      const auto full = numel * static_cast<std::int64_t>(tensor::element_size(piece.dtype));
      largest = std::max(largest, full);
      total += full;
      if (piece.data.defined()) shard += static_cast<std::int64_t>(piece.data.nbytes());
    }
  std::int64_t growth = 0, before = 0;
  double seconds = 0, stall = 0, first_stall = 0, async_total = 0;
  {
    checkpoint::ParallelCheckpoint ckpt(dir, 1, MPI_COMM_WORLD);
    comm.barrier();
    troupe::reset_peak_rss();
    before = troupe::proc_status_bytes("VmRSS:");
    // A first synchronous save (its RSS growth is the row's; its time is not counted:
    // a run's first files cost more), then `rounds` synchronous saves and as many
    // through save_async in the order S A A S S A A S ..., so neither kind gets the
    // later (or earlier) places of the run. One save's time varies 2-3x from the one
    // before on this disk; the medians are what the ratios compare.
    std::vector<double> sync, stalls, totals;
    std::string order = "S";
    for (int i = 0; i < 2 * rounds; ++i) order += (i + 1) % 4 < 2 ? 'S' : 'A';
    for (std::int64_t step = 0; step < static_cast<std::int64_t>(order.size()); ++step) {
      manifest.step = step;
      comm.barrier();
      const auto start = Clock::now();
      if (order[static_cast<std::size_t>(step)] == 'S') {
        file = ckpt.save(manifest, slices);
        const double took = std::chrono::duration<double>(Clock::now() - start).count();
        if (step == 0)
          growth = troupe::proc_status_bytes("VmHWM:") - before;
        else
          sync.push_back(took);
        continue;
      }
      const checkpoint::SaveHandle handle = ckpt.save_async(manifest, slices);
      const double blocked = std::chrono::duration<double>(Clock::now() - start).count();
      file = handle.get();
      const double done = std::chrono::duration<double>(Clock::now() - start).count();
      stalls.push_back(static_cast<double>(max_over_ranks(comm, static_cast<std::int64_t>(blocked * 1e6))) / 1e6);
      totals.push_back(static_cast<double>(max_over_ranks(comm, static_cast<std::int64_t>(done * 1e6))) / 1e6);
    }
    for (double& t : sync) t = static_cast<double>(max_over_ranks(comm, static_cast<std::int64_t>(t * 1e6))) / 1e6;
    seconds = median(sync);
    first_stall = stalls.front();
    stall = median(stalls);
    async_total = median(totals);
  }
  // Each rank against its own bound; the worst margin decides.
  const std::int64_t over = max_over_ranks(comm, growth - (shard + largest + (std::int64_t{64} << 20)));
  const std::int64_t worst_growth = max_over_ranks(comm, growth);
  const std::int64_t worst_shard = max_over_ranks(comm, shard);
  char text[1024];
  std::snprintf(text, sizeof text,
                "\"save\": {\"file_bytes\": %lld, \"seconds\": %.3f, \"growth_bytes\": %lld, \"shard_bytes\": %lld, "
                "\"largest_tensor_bytes\": %lld, \"bound_bytes\": %lld, \"within_bound\": %s, "
                "\"async_stall_s\": %.4f, \"async_first_stall_s\": %.4f, \"async_total_s\": %.3f, \"rounds\": %d}",
                static_cast<long long>(total), seconds, static_cast<long long>(worst_growth),
                static_cast<long long>(worst_shard), static_cast<long long>(largest),
                static_cast<long long>(worst_shard + largest + (std::int64_t{64} << 20)), over < 0 ? "true" : "false",
                stall, first_stall, async_total, rounds);
  return text;
}

struct Peak {
  std::int64_t live_before = 0, rss_before = 0;
  static Peak start() {
    Peak p;
    p.live_before = static_cast<std::int64_t>(tensor::host_memory_stats().live_bytes);
    tensor::reset_host_memory_peak();
    troupe::reset_peak_rss();
    p.rss_before = troupe::proc_status_bytes("VmRSS:");
    return p;
  }
  // The most live tensor bytes and the VmHWM growth since start().
  std::pair<std::int64_t, std::int64_t> since() const {
    return {static_cast<std::int64_t>(tensor::host_memory_stats().peak_bytes) - live_before,
            troupe::proc_status_bytes("VmHWM:") - rss_before};
  }
};

// FNV-1a over the full model and optimizer state (gathered a tensor at a time), the
// same on every rank: equal for two runs exactly when their states are.
std::uint64_t state_hash(parallel::FullyShardedDataParallel& fsdp) {
  std::uint64_t h = 1469598103934665603ull;
  const auto mix = [&](const Tensor& t) {
    const Tensor host = t.to(tensor::Device::cpu());
    const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
    for (std::size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  };
  fsdp.for_each_full_tensor([&](const std::string&, const Tensor& value) { mix(value); });
  for (const auto& [key, value] : fsdp.full_optimizer_state_dict()) mix(value);
  return h;
}

// --resume: the sharded resume of `flags.resume_file` into a model described on the
// meta device, in a fresh process.
std::string run_resume(const Flags& flags, collectives::Communicator& comm) {
  comm.barrier();
  const Peak peak = Peak::start();
  const auto start = Clock::now();
  const auto model = build_model(flags.model, tensor::Device::meta());
  std::int64_t n = 0;
  for (const auto& [name, p] : model->named_parameters()) n += p->data.numel();
  Trainer t(parallel::Sharding::fsdp, *model, comm, flags.backward_prefetch);
  {
    checkpoint::FileReader reader(flags.resume_file);
    reader.verify_share(comm.rank(), comm.size());
    const checkpoint::SectionReader model_section(reader, "model"), optimizer_section(reader, "optimizer");
    t.fsdp->load_local_slices(train::SectionSlices(model_section), train::SectionSlices(optimizer_section));
  }
  comm.barrier();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const auto [live, rss] = peak.since();
  std::int64_t unit = 0;
  for (const auto& path : t.fsdp->unit_paths()) unit = std::max(unit, t.fsdp->unit_padded_numel(path) * 4);
  char text[1024];
  std::snprintf(text, sizeof text,
                "{\"model\": \"%s\", \"mode\": \"fsdp\", \"ranks\": %d, \"parameters\": %lld, "
                "\"formula_bytes\": %.0f, \"unit_bytes\": %lld, \"resume\": {\"seconds\": %.3f, "
                "\"peak_live_bytes\": %lld, \"rss_growth_bytes\": %lld, \"state_hash\": \"%016llx\"}}",
                flags.model.c_str(), comm.size(), static_cast<long long>(n),
                formula_bytes(parallel::Sharding::fsdp, static_cast<double>(n), comm.size()),
                static_cast<long long>(unit), seconds, static_cast<long long>(max_over_ranks(comm, live)),
                static_cast<long long>(max_over_ranks(comm, rss)),
                static_cast<unsigned long long>(state_hash(*t.fsdp)));
  return text;
}

std::string run(const Flags& flags, collectives::Communicator& comm) {
  comm.barrier();
  const Peak construction = Peak::start();
  const auto built = build_model(flags.model, flags.init_meta ? tensor::Device::meta() : tensor::Device::cpu());
  nn::Module& model = *built;
  std::int64_t n = 0;
  for (const auto& [name, p] : model.named_parameters()) n += p->data.numel();
  // ddp and zero1 keep the whole model: materialised at once (ShardedModel does the same).
  if (flags.init_meta && (flags.mode == parallel::Sharding::ddp || flags.mode == parallel::Sharding::zero1))
    model.to(tensor::Device::cpu());
  Trainer t(flags.mode, model, comm, flags.backward_prefetch);
  const auto [construct_live, construct_rss] = construction.since();
  nn::CrossEntropyLoss loss_fn;

  // Each rank its own data (as from a sampler): 4 random batches, cycled.
  tensor::Generator data_gen(100 + static_cast<std::uint64_t>(comm.rank()));
  std::mt19937_64 label_rng(7 + static_cast<std::uint64_t>(comm.rank()));
  std::vector<std::pair<Tensor, Tensor>> batches;
  const bool gpt = is_gpt(flags.model);
  const std::int64_t classes = gpt ? gpt_config().vocab_size : widths_of(flags.model).back();
  const std::int64_t batch_size = gpt ? 1 : kBatch;
  const auto random_ids = [&](std::int64_t n) {
    Tensor ids = Tensor::empty({n}, DType::i64);
    for (std::int64_t i = 0; i < n; ++i)
      ids.data<std::int64_t>()[i] = static_cast<std::int64_t>(label_rng() % static_cast<std::uint64_t>(classes));
    return ids;
  };
  for (int b = 0; b < 4; ++b) {
    if (gpt)
      batches.emplace_back(random_ids(kGptTokens).reshape({1, kGptTokens}), random_ids(kGptTokens));
    else
      batches.emplace_back(tensor::uniform({kBatch, widths_of(flags.model).front()}, 0, 1, data_gen),
                           random_ids(kBatch));
  }
  std::size_t next = 0;
  auto batch = [&]() -> const std::pair<Tensor, Tensor>& { return batches[next++ % batches.size()]; };

  comm.barrier();
  troupe::reset_peak_rss();
  const std::int64_t rss_start = max_over_ranks(comm, troupe::proc_status_bytes("VmRSS:"));
  for (int i = 0; i < flags.warmup; ++i) {
    const auto& [x, y] = batch();
    t.forward_backward(loss_fn, x, y);
    t.step_and_zero();
  }
  std::vector<double> step_seconds;
  for (int i = 0; i < flags.steps; ++i) {
    const auto& [x, y] = batch();
    comm.barrier();
    const auto start = Clock::now();
    t.forward_backward(loss_fn, x, y);
    t.step_and_zero();
    comm.barrier();
    step_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  // One more backward, then the accounting (peak RSS first: state_dict() clones).
  double loss = 0;
  {
    const auto& [x, y] = batch();
    loss = t.forward_backward(loss_fn, x, y);
  }
  const std::int64_t peak_rss = max_over_ranks(comm, troupe::proc_status_bytes("VmHWM:"));
  const Trainer::Bytes b = t.bytes();
  const auto state = static_cast<std::int64_t>(b.parameters + b.gradients + b.optimizer);
  std::int64_t gathered = 0, unit = 0;
  if (t.fsdp) {
    gathered = static_cast<std::int64_t>(t.fsdp->stats().peak_gathered_bytes);
    for (const auto& path : t.fsdp->unit_paths()) unit = std::max(unit, t.fsdp->unit_padded_numel(path) * 4);
  }
  const std::int64_t worst_state = max_over_ranks(comm, state);
  const std::int64_t worst_params = max_over_ranks(comm, static_cast<std::int64_t>(b.parameters));
  const std::int64_t worst_grads = max_over_ranks(comm, static_cast<std::int64_t>(b.gradients));
  const std::int64_t worst_optim = max_over_ranks(comm, static_cast<std::int64_t>(b.optimizer));
  const std::int64_t worst_gathered = max_over_ranks(comm, gathered);
  t.step_and_zero();

  std::string save = "\"save\": null";
  if (!flags.save_dir.empty()) {
    std::filesystem::path file;
    save = save_full_state(*t.fsdp, comm, flags.save_dir, flags.save_rounds, file);
    char fields[512];
    std::snprintf(fields, sizeof fields, ", \"file\": \"%s\", \"state_hash\": \"%016llx\"", file.c_str(),
                  static_cast<unsigned long long>(state_hash(*t.fsdp)));
    save += fields;
  }

  const double step = median(step_seconds);
  char text[2048];
  std::snprintf(
      text, sizeof text,
      "{\"model\": \"%s\", \"mode\": \"%s\", \"ranks\": %d, \"batch_per_rank\": %lld, \"parameters\": %lld, "
      "\"samples_per_s\": %.2f, \"step_s\": %.4f, \"state_bytes\": %lld, \"parameter_bytes\": %lld, "
      "\"gradient_bytes\": %lld, \"optimizer_bytes\": %lld, \"formula\": \"%s\", "
      "\"formula_bytes\": %.0f, "
      "\"peak_gathered_bytes\": %lld, \"unit_bytes\": %lld, \"peak_rss_bytes\": %lld, \"rss_start_bytes\": %lld, "
      "\"init\": \"%s\", \"construct_peak_live_bytes\": %lld, \"construct_rss_growth_bytes\": %lld, "
      "\"loss\": %.6g, %s, \"steps\": [",
      flags.model.c_str(), parallel::sharding_name(flags.mode), comm.size(), static_cast<long long>(batch_size),
      static_cast<long long>(n), static_cast<double>(batch_size * comm.size()) / step, step,
      static_cast<long long>(worst_state), static_cast<long long>(worst_params), static_cast<long long>(worst_grads),
      static_cast<long long>(worst_optim), formula_text(flags.mode),
      formula_bytes(flags.mode, static_cast<double>(n), comm.size()), static_cast<long long>(worst_gathered),
      static_cast<long long>(unit), static_cast<long long>(peak_rss), static_cast<long long>(rss_start),
      flags.init_meta ? "meta" : "cpu", static_cast<long long>(max_over_ranks(comm, construct_live)),
      static_cast<long long>(max_over_ranks(comm, construct_rss)), loss, save.c_str());
  std::string out = text;
  for (std::size_t i = 0; i < step_seconds.size(); ++i) out += (i ? ", " : "") + std::to_string(step_seconds[i]);
  return out + "]}";
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  int status = 0;
  try {
    const Flags flags = parse_flags(argc, argv);
    tensor::set_num_threads(1);
    auto comm = collectives::world_communicator();
    const std::string json = flags.resume_file.empty() ? run(flags, *comm) : run_resume(flags, *comm);
    if (comm->rank() == 0) std::printf("%s\n", json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharding_bench: error: %s\n", e.what());
    status = 1;
  }
  return status;
}
