// Trains an MLP (64-256-256-10) on the UCI digits set, data-parallel over the ranks of
// an MPI job -- or in one process, with no code change:
//
//   build/examples/train_digits --epochs 30
//   mpirun -np 2 build/examples/train_digits --epochs 30 --metrics digits.jsonl  # + digits.png
//
// Reads top to bottom: flags; the recipe (data, model, optimizer) that every rank's
// TrainWorker builds; then the driver, on rank 0 only, which runs the epochs by asking
// all workers at once and reports. Gradients travel between the workers (DDP, one
// all-reduce per bucket); the driver only ever sees per-epoch sums. --batch-size is
// the global batch: N ranks take batch/N each (shares differing by one when N does not
// divide it, gradients weighted by share), so the run's mathematics do not depend on
// the number of ranks. The same flags (and world size) give bit-identical final
// parameters: the run prints their hash. --sharding zero1|zero2|fsdp trains the same
// model with sharded optimizer state, gradients or parameters (ZeRO-1/2/3); the
// checkpoints are the same files, so a run may resume in another mode.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "digits_dataset.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/status.hpp"
#include "troupe/train/train_worker.hpp"

using namespace troupe;

namespace {

struct Flags {
  std::string data = TROUPE_DIGITS_PATH;  // the copy in the source tree's data/
  int epochs = 30;
  int batch_size = 64;
  int hidden = 256;
  double lr = 0.05;
  double momentum = 0.9;
  std::uint64_t seed = 0;
  double require_accuracy = 0;  // exit status 3 if the final test accuracy is lower
  int accum_steps = 1;
  std::string sharding = "ddp";   // ddp, zero1, zero2 or fsdp
  std::string device = "cpu";     // cpu or cuda (gradients over NCCL)
  std::string backend;            // cuda: nccl (empty) or mpi, staged through host memory
  std::string precision = "f32";  // f32 or bf16 (bf16 model, f32 master weights; ddp)
  std::string metrics;            // JSONL metrics log; empty for none
  std::string best;               // file for the model with the best test accuracy; empty for none
  // Checkpoints: the folder (default: troupe-run's TROUPE_CHECKPOINT_DIR, if any), a
  // save every N optimizer steps besides the one at each epoch's end, and how many to keep.
  std::string checkpoint_dir;
  int save_every = 0;
  int keep_last = 3;
  bool fresh = false;            // start over in a folder with an earlier run's checkpoints
  bool allow_other_run = false;  // resume a checkpoint whose identity (below) differs
  std::string trace;             // a timeline of --trace-steps into this folder; empty for none
  std::string trace_steps;
};

const char* kUsage =
    "usage: train_digits [--data PATH] [--epochs N] [--batch-size N] [--hidden N] [--lr X]\n"
    "                    [--momentum X] [--seed N] [--require-accuracy X] [--accum-steps N]\n"
    "                    [--sharding ddp|zero1|zero2|fsdp] [--device cpu|cuda [--backend nccl|mpi]]\n"
    "                    [--precision f32|bf16]\n"
    "                    [--metrics FILE] [--best FILE]\n"
    "                    [--checkpoint-dir DIR] [--save-every STEPS] [--keep-last N]\n"
    "                    [--fresh] [--allow-other-run] [--trace DIR] [--trace-steps FIRST-LAST]\n"
    "  --batch-size is the global batch: each of N ranks takes about batch/N per step.\n"
    "  --sharding: ddp (default), zero1 (sharded optimizer state), zero2 (+ sharded\n"
    "  gradients) or fsdp (+ sharded parameters); checkpoints resume in any mode.\n"
    "  --device cuda: the model, batches and gradients on this rank's GPU (its local rank's),\n"
    "  gradients all-reduced over NCCL, in every sharding mode; --backend mpi sends them over\n"
    "  MPI through host memory instead, for ranks that share a GPU.\n"
    "  --precision bf16: mixed precision, a bf16 model stepping f32 master weights (ddp only).\n"
    "  --checkpoint-dir saves at each epoch's end (and every STEPS steps) and, started again\n"
    "  with the same DIR, resumes from its latest valid checkpoint. Under troupe-run it\n"
    "  defaults to troupe-run's --checkpoint-dir. A folder whose checkpoints are all\n"
    "  unusable is an error, never a silent start from step 0: --fresh starts over there\n"
    "  (the old files move to DIR/superseded-*/). A checkpoint of another run (other data,\n"
    "  model or hyper-parameters) is refused with what differs; --allow-other-run takes it.\n"
    "  --trace DIR writes a timeline of steps --trace-steps (default 3-5) to DIR/trace.json,\n"
    "  for ui.perfetto.dev or tools/plot_timeline.py; under troupe-run --trace, its folder.\n";

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (flag == "--fresh" || flag == "--allow-other-run") {
      (flag == "--fresh" ? f.fresh : f.allow_other_run) = true;
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
      if (flag == "--data")
        f.data = value;
      else if (flag == "--checkpoint-dir")
        f.checkpoint_dir = value;
      else if (flag == "--save-every")
        f.save_every = whole(std::stoi(value, &used));
      else if (flag == "--keep-last")
        f.keep_last = whole(std::stoi(value, &used));
      else if (flag == "--epochs")
        f.epochs = whole(std::stoi(value, &used));
      else if (flag == "--batch-size")
        f.batch_size = whole(std::stoi(value, &used));
      else if (flag == "--hidden")
        f.hidden = whole(std::stoi(value, &used));
      else if (flag == "--lr")
        f.lr = whole(std::stod(value, &used));
      else if (flag == "--momentum")
        f.momentum = whole(std::stod(value, &used));
      else if (flag == "--seed")
        f.seed = whole(std::stoull(value, &used));
      else if (flag == "--require-accuracy")
        f.require_accuracy = whole(std::stod(value, &used));
      else if (flag == "--accum-steps")
        f.accum_steps = whole(std::stoi(value, &used));
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
      else if (flag == "--best")
        f.best = value;
      else if (flag == "--trace")
        f.trace = value;
      else if (flag == "--trace-steps") {
        train::parse_trace_window(value, "--trace-steps");  // a bad window fails here, not on every rank
        f.trace_steps = value;
      } else
        throw InvalidArgument("unknown flag " + flag + "\n" + kUsage);
    } catch (const std::logic_error&) {  // stoi/stod: not a number, or out of range
      throw InvalidArgument("bad value '" + value + "' for " + flag + "\n" + kUsage);
    }
  }
  if (f.epochs < 1 || f.batch_size < 1 || f.hidden < 1 || f.accum_steps < 1 || !(f.lr > 0))
    throw InvalidArgument(
        std::string("--epochs, --batch-size, --hidden and --accum-steps must be >= 1 and --lr > 0\n") + kUsage);
  if (f.sharding != "ddp" && f.sharding != "zero1" && f.sharding != "zero2" && f.sharding != "fsdp")
    throw InvalidArgument("bad value '" + f.sharding + "' for --sharding: one of ddp, zero1, zero2, fsdp\n" + kUsage);
  if (f.device != "cpu" && f.device != "cuda")
    throw InvalidArgument("bad value '" + f.device + "' for --device: cpu or cuda\n" + kUsage);
  if (!f.backend.empty() && f.backend != "nccl" && f.backend != "mpi")
    throw InvalidArgument("bad value '" + f.backend + "' for --backend: nccl or mpi\n" + kUsage);
  if (f.backend == "nccl" && f.device != "cuda")
    throw InvalidArgument(std::string("--backend nccl needs --device cuda\n") + kUsage);
  if (f.precision != "f32" && f.precision != "bf16")
    throw InvalidArgument("bad value '" + f.precision + "' for --precision: f32 or bf16\n" + kUsage);
  if (f.save_every < 0 || f.keep_last < 1)
    throw InvalidArgument(std::string("--save-every must be >= 0 and --keep-last >= 1\n") + kUsage);
  if (f.checkpoint_dir.empty()) {
    if (const char* dir = std::getenv("TROUPE_CHECKPOINT_DIR")) f.checkpoint_dir = dir;
  }
  return f;
}

// The run's settings as JSON, recorded in every checkpoint's root attributes.
std::string config_json(const Flags& f) {
  char text[512];
  std::snprintf(text, sizeof text,
                "{\"example\": \"train_digits\", \"epochs\": %d, \"batch_size\": %d, \"hidden\": %d, "
                "\"lr\": %.17g, \"momentum\": %.17g, \"seed\": %llu, \"accum_steps\": %d, \"sharding\": \"%s\"}",
                f.epochs, f.batch_size, f.hidden, f.lr, f.momentum, static_cast<unsigned long long>(f.seed),
                f.accum_steps, f.sharding.c_str());
  return text;
}

// What makes a checkpoint this run's: the settings that decide its trajectory. The
// number of epochs, the sharding mode and the world size may change across a resume.
std::string run_identity(const Flags& f) {
  char text[512];
  std::snprintf(text, sizeof text, "data=%s hidden=%d lr=%.17g momentum=%.17g seed=%llu batch_size=%d accum_steps=%d",
                std::filesystem::path(f.data).filename().c_str(), f.hidden, f.lr, f.momentum,
                static_cast<unsigned long long>(f.seed), f.batch_size, f.accum_steps);
  return text;
}

// What each worker builds for itself, from the flags (sent to every rank).
struct DigitsRecipe {
  struct Config {
    std::string data;
    std::int64_t hidden = 256;
    double lr = 0.05, momentum = 0.9;
    std::uint64_t seed = 0;
    template <class A>
    void serialize(A& a) {
      a(data, hidden, lr, momentum, seed);
    }
  };

  // A fixed, seeded 80/20 split (the same on every rank), pixels scaled to [0, 1].
  static const examples::DigitsSplit& split(const Config& c) {
    static const examples::DigitsSplit split = examples::split_dataset(examples::load_digits(c.data), 0.2, 1234);
    return split;
  }
  static train::TensorDataset train_set(const Config& c) { return {split(c).train.inputs, split(c).train.labels}; }
  static train::TensorDataset test_set(const Config& c) { return {split(c).test.inputs, split(c).test.labels}; }

  // 64-H-H-10 with ReLU, PyTorch's default initialisation. Every rank draws it from
  // the seed; DDP then broadcasts rank 0's anyway.
  static std::unique_ptr<nn::Module> make_model(const Config& c) { return make_model(c, tensor::Device::cpu()); }
  // On the meta device in the sharded modes: each rank materialises only its shards.
  static std::unique_ptr<nn::Module> make_model(const Config& c, tensor::Device device) {
    tensor::Generator gen(c.seed);
    auto model = std::make_unique<nn::Sequential>();
    model->emplace<nn::Linear>(64, c.hidden, gen, true, tensor::DType::f32, device);
    model->emplace<nn::ReLU>();
    model->emplace<nn::Linear>(c.hidden, c.hidden, gen, true, tensor::DType::f32, device);
    model->emplace<nn::ReLU>();
    model->emplace<nn::Linear>(c.hidden, 10, gen, true, tensor::DType::f32, device);
    return model;
  }
  static std::unique_ptr<nn::Optimizer> make_optimizer(nn::Module& model, const Config& c) {
    return make_optimizer(model.named_parameters(), c);
  }
  // The same optimizer over any parameters: OSS's partition (zero1, zero2) or FSDP's
  // flat shards (fsdp).
  static std::unique_ptr<nn::Optimizer> make_optimizer(std::vector<nn::NamedParameter> params, const Config& c) {
    return std::make_unique<nn::SGD>(std::move(params), c.lr, c.momentum);
  }
};

using Worker = train::TrainWorker<DigitsRecipe>;

std::string format(const char* fmt, double a, double b = 0) {
  char text[128];
  std::snprintf(text, sizeof text, fmt, a, b);
  return text;
}

// People would rather look at a curve than read a log: leave a PNG beside it, drawn by
// tools/plot_metrics.py (needs python3-matplotlib; without it, a note and no plot).
void plot_metrics(const std::string& metrics) {
  const std::string command = std::string("/usr/bin/python3 ") + TROUPE_PLOT_SCRIPT + " '" + metrics + "' 2>&1";
  if (metrics.find('\'') != std::string::npos || std::system(command.c_str()) != 0)
    std::fprintf(stderr, "train_digits: no plot of %s (tools/plot_metrics.py failed; see above)\n", metrics.c_str());
}

// Rank 0: runs the epochs through the workers and reports. Returns the exit status.
int drive(const Flags& flags, const actors::ActorGroup<Worker>& workers, int world) {
  train::Status status(true, {.metrics_path = flags.metrics});
  const auto& split = DigitsRecipe::split({flags.data});
  std::printf("digits: %lld train, %lld test samples from %s\n", static_cast<long long>(split.train.size()),
              static_cast<long long>(split.test.size()), flags.data.c_str());
  const auto params =
      64LL * flags.hidden + flags.hidden + 1LL * flags.hidden * flags.hidden + flags.hidden + 10LL * flags.hidden + 10;
  std::printf("model: %lld parameters; SGD lr %.3g momentum %.3g; batch %d\n", params, flags.lr, flags.momentum,
              flags.batch_size);
  const auto micro = flags.batch_size / flags.accum_steps;
  status.summary({{"world", std::to_string(world) + " rank(s), batch " + std::to_string(micro / world) +
                                (micro % world ? "-" + std::to_string(micro / world + 1) : "") + " per rank x " +
                                std::to_string(flags.accum_steps) + " micro-batch(es)"},
                  {"model", "MLP 64-" + std::to_string(flags.hidden) + "-" + std::to_string(flags.hidden) + "-10, " +
                                std::to_string(params) + " parameters"},
                  {"optimizer", "SGD " + format("lr %g momentum %g", flags.lr, flags.momentum)},
                  {"sharding", flags.sharding},
                  {"data", flags.data + ", seed " + std::to_string(flags.seed)},
                  {"metrics", flags.metrics.empty() ? "(none)" : flags.metrics}});

  double test_accuracy = 0;
  std::int64_t steps = 0;
  int first_epoch = 1;
  if (!flags.checkpoint_dir.empty()) {
    // Every rank restores the same newest valid checkpoint, if there is one.
    const train::WorkerState resumed = train::resume_workers(workers);
    if (resumed.step > 0) {
      steps = resumed.step;
      first_epoch = static_cast<int>(resumed.epoch_finished ? resumed.epoch + 1 : resumed.epoch);
      status.print("resumed from " + flags.checkpoint_dir + " at step " + std::to_string(steps) + " (epoch " +
                   std::to_string(resumed.epoch) + (resumed.epoch_finished ? " done" : ", in progress") + ")");
    }
  }
  for (int epoch = first_epoch; epoch <= flags.epochs; ++epoch) {
    // Every worker trains its share of the epoch; then all evaluate their share.
    const auto results = actors::when_all(workers.ask(&Worker::train_epoch, std::int64_t{epoch})).get();
    const auto evals = actors::when_all(workers.ask(&Worker::evaluate)).get();
    double loss = 0, seconds = 0, test_loss = 0, correct = 0;
    std::int64_t samples = 0, test_samples = 0;
    for (const auto& r : results) {
      loss += r.loss_sum;
      samples += r.samples;
      seconds = std::max(seconds, r.seconds);
    }
    steps += results[0].steps;
    for (const auto& e : evals) {
      test_loss += e.loss_sum;
      correct += e.metric("correct");
      test_samples += e.samples;
    }
    test_accuracy = correct / static_cast<double>(test_samples);
    const double rate = static_cast<double>(samples) / seconds;
    char line[160];
    std::snprintf(line, sizeof line, "epoch %3d/%d  loss %.4f  test loss %.4f  test acc %.4f  %8.0f samples/s", epoch,
                  flags.epochs, loss / static_cast<double>(samples), test_loss / static_cast<double>(test_samples),
                  test_accuracy, rate);
    status.print(line);
    // In zero2 and fsdp modes every worker takes part (the model is gathered); rank 0 decides.
    if (!flags.best.empty() && (flags.sharding == "fsdp" || flags.sharding == "zero2"
                                    ? actors::when_all(workers.ask(&Worker::offer_best, test_accuracy, steps)).get()[0]
                                    : workers[0].ask(&Worker::offer_best, test_accuracy, steps).get()))
      status.print("  best test accuracy so far: model saved to " + flags.best);
    if (!flags.checkpoint_dir.empty()) actors::when_all(workers.ask(&Worker::save_checkpoint)).get();
    train::Metrics logged = {{"loss", loss / static_cast<double>(samples)},
                             {"test_loss", test_loss / static_cast<double>(test_samples)},
                             {"test_accuracy", test_accuracy}};
    for (const auto& share : train::time_shares(results)) logged.push_back(share);  // where the time went
    status.log(steps, epoch, logged, rate);
  }
  // Every rank must hold the same parameters; the hash names them for reproducibility checks.
  const auto states = actors::when_all(workers.ask(&Worker::state)).get();
  for (const auto& s : states)
    if (s.parameter_hash != states[0].parameter_hash)
      TROUPE_THROW(Error, "rank ", s.rank, "'s parameters differ from rank 0's after training");
  std::printf("final test accuracy %.4f after %d epochs (%.2f s)\n", test_accuracy, flags.epochs,
              status.wall_seconds());
  std::printf("parameters hash %016llx (%lld steps, %d rank(s))\n",
              static_cast<unsigned long long>(states[0].parameter_hash), static_cast<long long>(steps), world);
  if (!flags.metrics.empty()) plot_metrics(flags.metrics);
  if (test_accuracy < flags.require_accuracy) {
    std::fprintf(stderr, "train_digits: test accuracy %.4f is below the required %.4f\n", test_accuracy,
                 flags.require_accuracy);
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
    std::fprintf(stderr, "train_digits: %s\n", e.what());
    return 2;
  }
  tensor::set_num_threads(1);  // one compute thread per rank
  Runtime runtime(argc, argv);
  int status = 0;
  try {
    train::WorkerOptions options{.global_batch = flags.batch_size,
                                 .accum_steps = flags.accum_steps,
                                 .seed = flags.seed,
                                 .sharding = parallel::parse_sharding(flags.sharding),
                                 .device = train::parse_worker_device(flags.device),
                                 .backend = flags.backend,
                                 .precision = train::parse_precision(flags.precision),
                                 .epochs = flags.epochs,
                                 .best_path = flags.best,
                                 .checkpoint_dir = flags.checkpoint_dir,
                                 .save_every = flags.save_every,
                                 .keep_last = flags.keep_last,
                                 .run_id = std::getenv("TROUPE_RUN_ID") ? std::getenv("TROUPE_RUN_ID") : "",
                                 .config_json = config_json(flags),
                                 .checkpoint_attributes = {{"run_identity", run_identity(flags)}},
                                 .fresh = flags.fresh,
                                 .allow_other_run = flags.allow_other_run,
                                 .trace_dir = flags.trace,
                                 .trace_steps = flags.trace_steps};
    DigitsRecipe::Config config{flags.data, flags.hidden, flags.lr, flags.momentum, flags.seed};
    auto workers = runtime.spawn_on_each<Worker>(options, config);
    status = train::drive_then_stop(workers, runtime.rank(), [&] { return drive(flags, workers, runtime.size()); });
  } catch (const std::exception& e) {
    actors::print_error("train_digits", e, runtime.rank());
    status = 1;
  }
  runtime.shutdown();
  return status;
}
