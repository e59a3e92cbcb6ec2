#include "train_gpt_flags.hpp"

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

#include "troupe/error.hpp"
#include "troupe/train/step_trace.hpp"

namespace troupe::examples {

namespace {

// quick: under a minute at 2 ranks on two CPU cores; default (the quality target, <= 1.60
// nats/char): about 9 minutes there.
void apply_preset(Flags& f) {
  struct Preset {
    std::int64_t n_layer, n_head, n_embd, block_size, batch_size, steps, warmup_steps, eval_every, eval_samples;
    double dropout, lr, min_lr;
  };
  Preset p;
  if (f.preset == "quick")
    p = {2, 4, 128, 64, 32, 800, 40, 100, 256, 0.0, 3e-3, 3e-4};
  else if (f.preset == "default")
    p = {4, 4, 128, 128, 32, 2000, 100, 250, 512, 0.0, 2e-3, 2e-4};
  else
    throw InvalidArgument("bad value '" + f.preset + "' for --preset: quick or default");
  const auto pick = [](auto& value, auto preset) {
    if (value < 0) value = preset;
  };
  pick(f.n_layer, p.n_layer), pick(f.n_head, p.n_head), pick(f.n_embd, p.n_embd), pick(f.block_size, p.block_size);
  pick(f.batch_size, p.batch_size), pick(f.steps, p.steps), pick(f.warmup_steps, p.warmup_steps);
  pick(f.eval_every, p.eval_every), pick(f.eval_samples, p.eval_samples);
  pick(f.dropout, p.dropout), pick(f.lr, p.lr), pick(f.min_lr, p.min_lr);
}

const char* kUsage =
    "usage: train_gpt [--data PATH] [--preset quick|default]\n"
    "                 [--n-layer N] [--n-head N] [--n-embd N] [--block-size N] [--dropout X]\n"
    "                 [--activation-checkpointing N]\n"
    "                 [--batch-size N] [--accum-steps N] [--steps N] [--lr X] [--min-lr X]\n"
    "                 [--warmup-steps N] [--weight-decay X] [--grad-clip X] [--beta2 X] [--seed N]\n"
    "                 [--eval-every STEPS] [--eval-samples N] [--sample-chars N] [--temperature X]\n"
    "                 [--sharding ddp|zero1|zero2|fsdp] [--tp N [--sequence-parallel]]\n"
    "                 [--device cpu|cuda [--backend nccl|mpi]] [--precision f32|bf16]\n"
    "                 [--pp N] [--schedule gpipe|1f1b|interleaved|zero-bubble]\n"
    "                 [--micro-batches N] [--virtual-stages V] [--pp-cut parameters|uniform]\n"
    "                 [--metrics FILE] [--checkpoint-dir DIR] [--save-every STEPS] [--keep-last N]\n"
    "                 [--require-val-loss X] [--peak-gflops X] [--trace DIR] [--trace-steps FIRST-LAST]\n"
    "  --preset quick (a few minutes on 2 CPU cores) or default; model and optimisation flags\n"
    "  override the preset's values. --batch-size is the global batch of block_size + 1\n"
    "  character windows. --eval-samples windows of the validation text are evaluated every\n"
    "  --eval-every steps (0: all of them), and a checkpoint is saved then. --checkpoint-dir\n"
    "  resumes from its latest valid checkpoint; under troupe-run it defaults to troupe-run's.\n"
    "  --activation-checkpointing N recomputes every N-th block's activations in backward\n"
    "  (1: all blocks; 0, the default: none), for the same results in less memory.\n"
    "  --tp N splits each block's attention heads and MLP, and the vocabulary, over N\n"
    "  consecutive ranks (Megatron's tensor parallelism, dropout 0); --sharding ddp, zero2 or\n"
    "  fsdp between the groups (fsdp x tp: each group's part sharded over the groups).\n"
    "  --sequence-parallel also splits the positions between those layers over the N ranks\n"
    "  (Megatron's sequence parallelism: 1/N of the LayerNorms' and residuals' activations).\n"
    "  --pp N cuts the blocks into N pipeline stages on consecutive ranks, each step one pass\n"
    "  of --schedule over --micro-batches micro-batches (gradients averaged between groups;\n"
    "  --sharding zero1 shards each stage's optimizer state over them, fsdp its parameters as\n"
    "  well between steps). interleaved (Megatron's)\n"
    "  cuts the blocks into N x --virtual-stages stages (default 2), V a rank, for V times less\n"
    "  idle time at V times the messages; --micro-batches a multiple of N. --pp-cut parameters\n"
    "  (the default) evens out the stages' parameters, the token tables counted on the end\n"
    "  stages; uniform gives every stage as many blocks. zero-bubble runs 1f1b's order with\n"
    "  the weights' gradients put off to fill the waits (ZB-H1): less idle, same results.\n"
    "  Together, each stage is split over --tp ranks: a dp x pp x tp grid, tp fastest.\n"
    "  --device cuda puts each rank on its local rank's GPU, collectives over NCCL; --backend\n"
    "  mpi sends them over MPI through host memory instead, for ranks that share a GPU.\n"
    "  MFU: model FLOPs (nanoGPT's 6N + 12 L C T per token) over the ranks' peak, --peak-gflops\n"
    "  per rank, or else what a 512^3 matmul reaches on one core here as every rank starts.\n"
    "  --trace DIR writes a timeline of steps --trace-steps (default 3-5) to DIR/trace.json,\n"
    "  for ui.perfetto.dev or tools/plot_timeline.py; under troupe-run --trace, its folder.\n";

}  // namespace

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (flag == "--sequence-parallel") {  // the one flag without a value
      f.sequence_parallel = true;
      continue;
    }
    if (i + 1 >= argc) throw InvalidArgument(flag + " needs a value\n" + kUsage);
    const std::string value = argv[++i];
    try {
      std::size_t used = 0;
      auto whole = [&](auto parsed) {
        if (used != value.size()) throw std::invalid_argument(value);
        return parsed;
      };
      auto integer = [&] { return whole(std::stoll(value, &used)); };
      auto real = [&] { return whole(std::stod(value, &used)); };
      if (flag == "--data")
        f.data = value;
      else if (flag == "--preset")
        f.preset = value;
      else if (flag == "--n-layer")
        f.n_layer = integer();
      else if (flag == "--n-head")
        f.n_head = integer();
      else if (flag == "--n-embd")
        f.n_embd = integer();
      else if (flag == "--block-size")
        f.block_size = integer();
      else if (flag == "--dropout")
        f.dropout = real();
      else if (flag == "--activation-checkpointing")
        f.activation_checkpointing = integer();
      else if (flag == "--batch-size")
        f.batch_size = integer();
      else if (flag == "--accum-steps")
        f.accum_steps = static_cast<int>(integer());
      else if (flag == "--steps")
        f.steps = integer();
      else if (flag == "--lr")
        f.lr = real();
      else if (flag == "--min-lr")
        f.min_lr = real();
      else if (flag == "--warmup-steps")
        f.warmup_steps = integer();
      else if (flag == "--weight-decay")
        f.weight_decay = real();
      else if (flag == "--grad-clip")
        f.grad_clip = real();
      else if (flag == "--beta2")
        f.beta2 = real();
      else if (flag == "--seed")
        f.seed = whole(std::stoull(value, &used));
      else if (flag == "--eval-every")
        f.eval_every = integer();
      else if (flag == "--eval-samples")
        f.eval_samples = integer();
      else if (flag == "--sample-chars")
        f.sample_chars = integer();
      else if (flag == "--temperature")
        f.temperature = real();
      else if (flag == "--tp")
        f.tp = static_cast<int>(integer());
      else if (flag == "--pp")
        f.pp = static_cast<int>(integer());
      else if (flag == "--schedule")
        f.schedule = value;
      else if (flag == "--micro-batches")
        f.micro_batches = static_cast<int>(integer());
      else if (flag == "--virtual-stages")
        f.virtual_stages = static_cast<int>(integer());
      else if (flag == "--pp-cut")
        f.pp_cut = value;
      else if (flag == "--sharding")
        f.sharding = value;
      else if (flag == "--device")
        f.device = value;
      else if (flag == "--backend")
        f.backend = value;
      else if (flag == "--precision")
        f.precision = value;
      else if (flag == "--metrics")
        f.metrics = value;
      else if (flag == "--checkpoint-dir")
        f.checkpoint_dir = value;
      else if (flag == "--trace")
        f.trace = value;
      else if (flag == "--trace-steps") {
        train::parse_trace_window(value, "--trace-steps");  // a bad window fails here, not on every rank
        f.trace_steps = value;
      } else if (flag == "--save-every")
        f.save_every = static_cast<int>(integer());
      else if (flag == "--keep-last")
        f.keep_last = static_cast<int>(integer());
      else if (flag == "--peak-gflops")
        f.peak_gflops = real();
      else if (flag == "--require-val-loss")
        f.require_val_loss = real();
      else
        throw InvalidArgument("unknown flag " + flag + "\n" + kUsage);
    } catch (const std::logic_error&) {  // stoll/stod: not a number, or out of range
      throw InvalidArgument("bad value '" + value + "' for " + flag + "\n" + kUsage);
    }
  }
  apply_preset(f);
  const auto require = [](bool ok, const std::string& what) {
    if (!ok) throw InvalidArgument(what + "\n" + kUsage);
  };
  require(f.n_layer >= 1 && f.n_head >= 1 && f.n_embd >= 1 && f.block_size >= 1,
          "--n-layer, --n-head, --n-embd and --block-size must be >= 1");
  require(f.n_embd % f.n_head == 0,
          "--n-embd " + std::to_string(f.n_embd) + " must be a multiple of --n-head " + std::to_string(f.n_head));
  require(f.dropout >= 0 && f.dropout < 1, "--dropout must be in [0, 1)");
  require(f.activation_checkpointing >= 0, "--activation-checkpointing must be >= 0");
  require(f.tp >= 1 && f.n_head % f.tp == 0,
          "--tp " + std::to_string(f.tp) + " must be >= 1 and divide --n-head " + std::to_string(f.n_head));
  require(!f.sequence_parallel || (f.tp > 1 && f.block_size % f.tp == 0),
          "--sequence-parallel needs --tp > 1 dividing --block-size " + std::to_string(f.block_size));
  require(f.pp >= 1 && f.pp <= f.n_layer,
          "--pp " + std::to_string(f.pp) + " must be in [1, --n-layer " + std::to_string(f.n_layer) + "]");
  require(f.schedule == "gpipe" || f.schedule == "1f1b" || f.schedule == "interleaved" || f.schedule == "zero-bubble",
          "bad value '" + f.schedule + "' for --schedule: gpipe, 1f1b, interleaved or zero-bubble");
  require(f.micro_batches >= 1, "--micro-batches must be >= 1");
  require(f.pp_cut == "parameters" || f.pp_cut == "uniform",
          "bad value '" + f.pp_cut + "' for --pp-cut: parameters or uniform");
  const bool interleaved = f.schedule == "interleaved";
  if (f.virtual_stages == 0) f.virtual_stages = interleaved ? 2 : 1;
  require(interleaved ? f.virtual_stages >= 2 : f.virtual_stages == 1,
          "--virtual-stages " + std::to_string(f.virtual_stages) + ": 2 or more with --schedule interleaved, " +
              "1 (or none) with the others");
  require(!interleaved || (f.pp > 1 && f.micro_batches % f.pp == 0 && f.pp * f.virtual_stages <= f.n_layer),
          "--schedule interleaved needs --pp > 1, --micro-batches a multiple of --pp, and --pp x --virtual-stages " +
              std::to_string(f.pp * f.virtual_stages) + " stages within --n-layer " + std::to_string(f.n_layer));
  require(f.batch_size >= 1 && f.accum_steps >= 1 && f.steps >= 1 && f.eval_every >= 1,
          "--batch-size, --accum-steps, --steps and --eval-every must be >= 1");
  require(f.warmup_steps >= 0 && f.eval_samples >= 0 && f.sample_chars >= 0,
          "--warmup-steps, --eval-samples and --sample-chars must be >= 0");
  require(f.warmup_steps < f.steps,
          "--warmup-steps " + std::to_string(f.warmup_steps) + " must be < --steps " + std::to_string(f.steps));
  require(f.lr > 0 && f.min_lr >= 0 && f.min_lr <= f.lr, "--lr must be > 0 and --min-lr in [0, lr]");
  require(f.peak_gflops >= 0, "--peak-gflops must be >= 0");
  require(f.weight_decay >= 0 && f.grad_clip >= 0 && f.beta2 > 0 && f.beta2 < 1 && f.temperature >= 0,
          "--weight-decay, --grad-clip and --temperature must be >= 0 and --beta2 in (0, 1)");
  require(f.sharding == "ddp" || f.sharding == "zero1" || f.sharding == "zero2" || f.sharding == "fsdp",
          "bad value '" + f.sharding + "' for --sharding: one of ddp, zero1, zero2, fsdp");
  require(f.device == "cpu" || f.device == "cuda", "bad value '" + f.device + "' for --device: cpu or cuda");
  require(f.backend.empty() || f.backend == "nccl" || f.backend == "mpi",
          "bad value '" + f.backend + "' for --backend: nccl or mpi");
  require(f.backend != "nccl" || f.device == "cuda", "--backend nccl needs --device cuda");
  require(f.precision == "f32" || f.precision == "bf16",
          "bad value '" + f.precision + "' for --precision: f32 or bf16");
  require(f.save_every >= 0 && f.keep_last >= 1, "--save-every must be >= 0 and --keep-last >= 1");
  if (f.checkpoint_dir.empty()) {
    if (const char* dir = std::getenv("TROUPE_CHECKPOINT_DIR")) f.checkpoint_dir = dir;
  }
  return f;
}

}  // namespace troupe::examples
