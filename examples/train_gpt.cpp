// Trains a character-level GPT on Moby-Dick, data-parallel over the ranks of an MPI
// job, or in one process:
//
//   build/examples/train_gpt --preset quick
//   mpirun -np 2 build/examples/train_gpt --preset default --metrics gpt.jsonl --checkpoint-dir ckpt
//
// Reads top to bottom, as llm.c's train_gpt2.c does (the flags are in
// train_gpt_flags.*): the data (the sorted set of the file's characters is the
// vocabulary, the first 90% of the characters train, the rest validate); the recipe every rank's TrainWorker builds
// (nanoGPT's model, AdamW with decay on matrices only, warm-up and cosine decay); then the driver on rank 0, which runs
// the steps in chunks of --eval-every, evaluates, checkpoints and finally samples a passage. --batch-size is the global
// batch of (block_size + 1)- character windows; the run's mathematics do not depend on the number of ranks, and the
// same flags and world size give bit-identical parameters (the run prints their hash), also across a kill -9 and a
// resume.
//
// Checkpoints record the vocabulary (root attribute `vocab`, UTF-8) and the model's
// shape under nanoGPT's names (`model_args`), so any reader can decode the model; a
// checkpoint folder holding another vocabulary or shape is refused before anything is
// loaded or written.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "char_corpus.hpp"
#include "train_gpt_flags.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/nn/adamw.hpp"
#include "troupe/nn/gpt.hpp"
#include "troupe/nn/lr_scheduler.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/status.hpp"
#include "troupe/train/token_windows.hpp"
#include "troupe/train/train_worker.hpp"

using namespace troupe;
using examples::Flags;
using examples::parse_flags;

namespace {

// ----------------------------------------------------------------------------- data

// The whole file's characters; every rank reads it (1.2 MB) and splits it alike.
const examples::CharCorpus& corpus(const std::string& path) {
  static const examples::CharCorpus loaded = examples::load_char_corpus(path);
  return loaded;
}

std::int64_t train_characters(const examples::CharCorpus& c) { return c.tokens.numel() * 9 / 10; }

// The validation text must hold one window: a block size larger than it is the user's
// mistake, named with the file, rather than an empty evaluation.
train::TokenWindows windows(const std::string& path, const Tensor& tokens, std::int64_t block_size, const char* part) {
  if (tokens.numel() < block_size + 1)
    TROUPE_THROW(InvalidArgument, "--block-size ", block_size, " is too large for ", path, ": its ", part, " part has ",
                 tokens.numel(), " characters, and one window needs ", block_size + 1);
  return {tokens, block_size};
}

// --------------------------------------------------------------------------- recipe

struct GptRecipe {
  struct Config {
    std::string data;
    std::int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
    double dropout = 0;
    std::uint64_t seed = 0;
    double lr = 0, min_lr = 0, weight_decay = 0, beta2 = 0;
    std::int64_t warmup_steps = 0, steps = 0;
    std::int64_t checkpoint_every = 0;  // blocks whose activations are recomputed (GPT::checkpoint_blocks)
    std::string pp_cut = "parameters";  // parallel::PipelineCut under --pp
    template <class A>
    void serialize(A& a) {
      a(data, n_layer, n_head, n_embd, block_size, vocab_size, dropout, seed, lr, min_lr, weight_decay, beta2,
        warmup_steps, steps, checkpoint_every, pp_cut);
    }
    nn::GPTConfig model() const {
      return {.block_size = block_size,
              .vocab_size = vocab_size,
              .n_layer = n_layer,
              .n_head = n_head,
              .n_embd = n_embd,
              .dropout = dropout};
    }
  };

  static train::TokenWindows train_set(const Config& c) {
    const auto& text = corpus(c.data);
    return windows(c.data, text.tokens.slice(0, train_characters(text)), c.block_size, "training");
  }
  static train::TokenWindows test_set(const Config& c) {
    const auto& text = corpus(c.data);
    return windows(c.data, text.tokens.slice(train_characters(text), text.tokens.numel()), c.block_size, "validation");
  }

  // GPT-2's initialisation from the seed on every rank (DDP broadcasts rank 0's anyway).
  static std::unique_ptr<nn::Module> make_model(const Config& c) { return make_model(c, tensor::Device::cpu()); }
  // On the meta device in the sharded modes: each rank materialises only its shards.
  static std::unique_ptr<nn::Module> make_model(const Config& c, tensor::Device device) {
    auto model = std::make_unique<nn::GPT>(c.model(), c.seed, tensor::DType::f32, device);
    model->checkpoint_blocks(c.checkpoint_every);
    return model;
  }
  // This rank's part of the model under --tp (troupe/parallel/tensor_parallel.hpp).
  static std::unique_ptr<nn::Module> make_model(const Config& c, collectives::Communicator& tp) {
    auto model = parallel::tensor_parallel_gpt(c.model(), c.seed, tp);
    model->checkpoint_blocks(c.checkpoint_every);
    return model;
  }
  // Stage `stage` of `stages` under --pp (troupe/parallel/pipeline.hpp).
  static std::unique_ptr<parallel::PipelineStage> make_stage(const Config& c, int stage, int stages) {
    return std::make_unique<parallel::GptStage>(c.model(), c.seed, stage, stages, nullptr,
                                                parallel::parse_pipeline_cut(c.pp_cut));
  }
  // That stage split over `tp` under --pp and --tp together.
  static std::unique_ptr<parallel::PipelineStage> make_stage(const Config& c, int stage, int stages,
                                                             collectives::Communicator& tp) {
    return std::make_unique<parallel::GptStage>(c.model(), c.seed, stage, stages, &tp,
                                                parallel::parse_pipeline_cut(c.pp_cut));
  }
  static std::unique_ptr<nn::Optimizer> make_optimizer(nn::Module& model, const Config& c) {
    return make_optimizer(model.named_parameters(), c);
  }
  // nanoGPT's AdamW: weight decay on matrices and embedding tables only.
  static std::unique_ptr<nn::Optimizer> make_optimizer(std::vector<nn::NamedParameter> params, const Config& c) {
    auto adamw = std::make_unique<nn::AdamW>(std::move(params), c.lr, nn::Betas{0.9, c.beta2}, 1e-8, c.weight_decay);
    adamw->set_weight_decay_filter(nn::decay_matrices_only);
    return adamw;
  }
  static std::unique_ptr<nn::LRScheduler> make_scheduler(nn::Optimizer& optimizer, const Config& c) {
    return std::make_unique<nn::CosineWithWarmup>(optimizer, c.warmup_steps, c.steps, c.min_lr);
  }
  // FSDP's units: the transformer blocks (the embeddings, ln_f and the tied head stay
  // in the root unit).
  static parallel::FsdpOptions fsdp_options(const Config& c) {
    parallel::FsdpOptions options;
    for (std::int64_t i = 0; i < c.n_layer; ++i) options.wrap.push_back("transformer.h." + std::to_string(i));
    return options;
  }
};

using Worker = train::TrainWorker<GptRecipe>;

// The model's shape under nanoGPT's names: checked against every checkpoint it resumes from.
std::string model_args_json(const GptRecipe::Config& c) {
  return "{\"n_layer\": " + std::to_string(c.n_layer) + ", \"n_head\": " + std::to_string(c.n_head) +
         ", \"n_embd\": " + std::to_string(c.n_embd) + ", \"block_size\": " + std::to_string(c.block_size) +
         ", \"vocab_size\": " + std::to_string(c.vocab_size) + "}";
}

// The run's settings as JSON, recorded in every checkpoint's root attributes.
std::string config_json(const Flags& f, const GptRecipe::Config& c) {
  char text[768];
  std::snprintf(text, sizeof text,
                "{\"example\": \"train_gpt\", \"n_layer\": %lld, \"n_head\": %lld, \"n_embd\": %lld, "
                "\"block_size\": %lld, \"vocab_size\": %lld, \"dropout\": %.17g, \"bias\": true, "
                "\"batch_size\": %lld, \"accum_steps\": %d, \"steps\": %lld, \"lr\": %.17g, \"min_lr\": %.17g, "
                "\"warmup_steps\": %lld, \"weight_decay\": %.17g, \"grad_clip\": %.17g, \"beta2\": %.17g, "
                "\"seed\": %llu, \"sharding\": \"%s\", \"train_fraction\": 0.9}",
                static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head), static_cast<long long>(c.n_embd),
                static_cast<long long>(c.block_size), static_cast<long long>(c.vocab_size), c.dropout,
                static_cast<long long>(f.batch_size), f.accum_steps, static_cast<long long>(f.steps), f.lr, f.min_lr,
                static_cast<long long>(f.warmup_steps), f.weight_decay, f.grad_clip, f.beta2,
                static_cast<unsigned long long>(f.seed), f.sharding.c_str());
  return text;
}

// --------------------------------------------------------------------------- driver

// Model FLOPs per token, forward and backward, as nanoGPT's estimate_mfu counts them: 6
// per non-embedding parameter plus attention's 12 L C T (recomputed activations excluded).
double flops_per_token(const GptRecipe::Config& c) {
  const double n = static_cast<double>(
      nn::GPT(c.model(), c.seed, tensor::DType::f32, tensor::Device::meta()).non_embedding_parameter_count());
  return 6 * n + 12.0 * static_cast<double>(c.n_layer * c.n_embd * c.block_size);
}

// FLOP/s of troupe's 512^3 f32 matmul on this thread over 0.2 s. Every rank measures as
// it starts, together, so the cores are as shared as in training. It stands in for the
// CPU's peak: a VM's /proc/cpuinfo clock is not the core's (turbo), and a theoretical
// peak from it would be wrong; so this MFU is against the practical GEMM ceiling.
double matmul_flops() {
  tensor::Generator gen(1);
  const Tensor a = tensor::normal({512, 512}, 0, 1, gen), b = tensor::normal({512, 512}, 0, 1, gen);
  for (int i = 0; i < 3; ++i) tensor::matmul(a, b);
  const auto start = std::chrono::steady_clock::now();
  int calls = 0;
  double seconds = 0;
  while (seconds < 0.2) {
    tensor::matmul(a, b);
    ++calls;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return 2.0 * 512 * 512 * 512 * calls / seconds;
}

std::string format(const char* fmt, double a, double b) {
  char text[128];
  std::snprintf(text, sizeof text, fmt, a, b);
  return text;
}

void plot_metrics(const std::string& metrics) {
  const std::string command = std::string("/usr/bin/python3 ") + TROUPE_PLOT_SCRIPT + " '" + metrics + "' 2>&1";
  if (metrics.find('\'') != std::string::npos || std::system(command.c_str()) != 0)
    std::fprintf(stderr, "train_gpt: no plot of %s (tools/plot_metrics.py failed; see above)\n", metrics.c_str());
}

// The mean validation loss over every worker's share.
double validation_loss(const actors::ActorGroup<Worker>& workers) {
  double loss = 0;
  std::int64_t samples = 0;
  for (const auto& e : actors::when_all(workers.ask(&Worker::evaluate)).get()) {
    loss += e.loss_sum;
    samples += e.samples;
  }
  return loss / static_cast<double>(samples);
}

// A passage from the trained model, drawn on the driver from a fixed seed.
std::string sample(const actors::ActorGroup<Worker>& workers, const GptRecipe::Config& config, const Flags& flags) {
  // zero2 and fsdp gather the parameters: every worker takes part, rank 0 answers.
  const auto states = actors::when_all(workers.ask(&Worker::model_state)).get();
  nn::StateDict state;
  for (auto& [name, value] : states[0]) state.insert(name, value);
  nn::GPT model(config.model(), config.seed);
  model.load_state_dict(state);
  const examples::CharCorpus& text = corpus(config.data);
  const std::vector<std::int64_t> prompt{text.tokens.data<std::int64_t>()[0]};  // the book's first character
  tensor::Generator gen(flags.seed);
  return text.decode(model.generate(prompt, flags.sample_chars, flags.temperature, gen));
}

// "blocks 1+3+3+1 by parameters": the stages' blocks in pipeline order.
std::string stage_blocks(const GptRecipe::Config& c, int stages) {
  const auto cut = parallel::gpt_pipeline_cut(c.model(), stages, parallel::parse_pipeline_cut(c.pp_cut));
  std::string out = "blocks ";
  for (std::size_t s = 0; s + 1 < cut.size(); ++s) out += (s ? "+" : "") + std::to_string(cut[s + 1] - cut[s]);
  return out + (c.pp_cut == "uniform" ? " uniform" : " by parameters");
}

// Rank 0: runs the steps through the workers and reports. Returns the exit status.
int drive(const Flags& flags, const GptRecipe::Config& config, const actors::ActorGroup<Worker>& workers, int world,
          double rank_peak) {
  train::Status status(true, {.metrics_path = flags.metrics});
  const examples::CharCorpus& text = corpus(config.data);
  const std::int64_t parameters = nn::GPT(config.model(), config.seed).parameter_count();
  const double peak = world * rank_peak, model_flops = flops_per_token(config);
  status.summary(
      {{"data", config.data + ": " + std::to_string(text.tokens.numel()) + " characters, " +
                    std::to_string(text.vocab_size()) + " distinct; first 90% train, the rest validate"},
       {"model", "GPT " + model_args_json(config) + ", " + std::to_string(parameters) + " parameters"},
       {"optimizer", format("AdamW lr %g -> %g", flags.lr, flags.min_lr) + " (warm-up " +
                         std::to_string(flags.warmup_steps) + ", cosine), " +
                         format("weight decay %g, clip %g", flags.weight_decay, flags.grad_clip)},
       {"world", std::to_string(world) + " rank(s), global batch " + std::to_string(flags.batch_size) + " x " +
                     std::to_string(config.block_size) + " characters, " + flags.sharding +
                     (flags.tp > 1 ? " x tp " + std::to_string(flags.tp) +
                                         (flags.sequence_parallel ? " (sequence parallel)" : "")
                                   : std::string()) +
                     (flags.pp > 1 ? " x pp " + std::to_string(flags.pp) + " " + flags.schedule + " (" +
                                         std::to_string(flags.micro_batches) + " micro-batches" +
                                         (flags.virtual_stages > 1
                                              ? ", " + std::to_string(flags.virtual_stages) + " stages a rank"
                                              : std::string()) +
                                         ", " + stage_blocks(config, flags.pp * flags.virtual_stages) + ")"
                                   : std::string()) +
                     ", " + flags.device + ", " + flags.precision},
       {"mfu",
        format("%.3g MFLOP per token, peak %.3g GFLOP/s", model_flops / 1e6, peak / 1e9) +
            (flags.peak_gflops > 0 ? " (--peak-gflops x ranks)" : " (a 512^3 matmul on one core here, x ranks)")},
       {"metrics", flags.metrics.empty() ? "(none)" : flags.metrics}});

  std::int64_t step = 0;
  if (!flags.checkpoint_dir.empty()) {
    step = train::resume_workers(workers).step;  // every rank restores the same newest valid checkpoint
    if (step > 0) status.print("resumed from " + flags.checkpoint_dir + " at step " + std::to_string(step));
  }
  double val_loss = 0;
  bool evaluated = false;
  while (step < flags.steps) {
    const std::int64_t chunk = std::min(flags.eval_every - step % flags.eval_every, flags.steps - step);
    const auto results = actors::when_all(workers.ask(&Worker::train_steps, chunk)).get();
    double loss = 0, seconds = 0;
    std::int64_t samples = 0;
    for (const auto& r : results) {
      loss += r.loss_sum;
      samples += r.samples;
      seconds = std::max(seconds, r.seconds);
    }
    step += chunk;
    val_loss = validation_loss(workers);
    evaluated = true;
    const double tokens_per_s = static_cast<double>(samples * config.block_size) / seconds;
    const double mfu = tokens_per_s * model_flops / peak;
    char line[200];
    std::snprintf(line, sizeof line, "step %5lld/%lld  train loss %.4f  val loss %.4f  %8.0f tokens/s  MFU %.1f%%",
                  static_cast<long long>(step), static_cast<long long>(flags.steps),
                  loss / static_cast<double>(samples), val_loss, tokens_per_s, 100 * mfu);
    status.print(line);
    if (!flags.checkpoint_dir.empty()) actors::when_all(workers.ask(&Worker::save_checkpoint)).get();
    train::Metrics logged = {{"loss", loss / static_cast<double>(samples)},
                             {"val_loss", val_loss},
                             {"tokens_per_s", tokens_per_s},
                             {"mfu", mfu}};
    for (const auto& share : train::time_shares(results)) logged.push_back(share);  // where the time went
    status.log(step, results[0].epoch, logged, static_cast<double>(samples) / seconds);
  }
  if (!evaluated) val_loss = validation_loss(workers);  // resumed after the last step
  // Every rank must hold the same parameters; the hash names them for reproducibility checks.
  const auto states = actors::when_all(workers.ask(&Worker::state)).get();
  for (const auto& s : states)
    if (s.parameter_hash != states[0].parameter_hash)
      TROUPE_THROW(Error, "rank ", s.rank, "'s parameters differ from rank 0's after training");
  std::printf("final val loss %.6f after %lld steps (%.1f s)\n", val_loss, static_cast<long long>(step),
              status.wall_seconds());
  std::printf("parameters hash %016llx (%lld steps, %d rank(s))\n",
              static_cast<unsigned long long>(states[0].parameter_hash), static_cast<long long>(step), world);
  if (flags.sample_chars > 0)
    std::printf("sample (temperature %.2f, seed %llu):\n%s\n", flags.temperature,
                static_cast<unsigned long long>(flags.seed), sample(workers, config, flags).c_str());
  std::fflush(stdout);
  if (!flags.metrics.empty()) plot_metrics(flags.metrics);
  if (flags.require_val_loss > 0 && !(val_loss <= flags.require_val_loss)) {
    std::fprintf(stderr, "train_gpt: final val loss %.4f is above the required %.4f\n", val_loss,
                 flags.require_val_loss);
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse_flags(argc, argv);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "train_gpt: %s\n", e.what());
    return 2;
  }
  tensor::set_num_threads(1);  // one compute thread per rank
  const double rank_peak = flags.peak_gflops > 0 ? flags.peak_gflops * 1e9 : matmul_flops();
  Runtime runtime(argc, argv);
  int status = 0;
  try {
    const examples::CharCorpus& text = corpus(flags.data);  // a bad file stops every rank here, before any worker
    const GptRecipe::Config config{.data = flags.data,
                                   .n_layer = flags.n_layer,
                                   .n_head = flags.n_head,
                                   .n_embd = flags.n_embd,
                                   .block_size = flags.block_size,
                                   .vocab_size = text.vocab_size(),
                                   .dropout = flags.dropout,
                                   .seed = flags.seed,
                                   .lr = flags.lr,
                                   .min_lr = flags.min_lr,
                                   .weight_decay = flags.weight_decay,
                                   .beta2 = flags.beta2,
                                   .warmup_steps = flags.warmup_steps,
                                   .steps = flags.steps,
                                   .checkpoint_every = flags.activation_checkpointing,
                                   .pp_cut = flags.pp_cut};
    train::WorkerOptions options{
        .global_batch = flags.batch_size,
        .accum_steps = flags.accum_steps,
        .seed = flags.seed,
        .sharding = parallel::parse_sharding(flags.sharding),
        .tensor_parallel = flags.tp,
        .sequence_parallel = flags.sequence_parallel,
        .pipeline_parallel = flags.pp,
        .pipeline_schedule = flags.schedule,
        .micro_batches = flags.micro_batches,
        .virtual_stages = flags.virtual_stages,
        .device = train::parse_worker_device(flags.device),
        .backend = flags.backend,
        .precision = train::parse_precision(flags.precision),
        .max_grad_norm = flags.grad_clip,
        .checkpoint_dir = flags.checkpoint_dir,
        .save_every = flags.save_every,
        .keep_last = flags.keep_last,
        .run_id = std::getenv("TROUPE_RUN_ID") ? std::getenv("TROUPE_RUN_ID") : "",
        .config_json = config_json(flags, config),
        .checkpoint_attributes = {{"vocab", text.vocab_utf8()}, {"model_args", model_args_json(config)}},
        .eval_batch = 64,
        .eval_samples = flags.eval_samples,
        .trace_dir = flags.trace,
        .trace_steps = flags.trace_steps};
    auto workers = runtime.spawn_on_each<Worker>(options, config);
    status = train::drive_then_stop(workers, runtime.rank(),
                                    [&] { return drive(flags, config, workers, runtime.size(), rank_peak); });
  } catch (const std::exception& e) {
    actors::print_error("train_gpt", e, runtime.rank());
    status = 1;
  }
  runtime.shutdown();
  return status;
}
