// A hyper-parameter search that stops losing trials early (successive halving, as
// Ray Tune's schedulers do), on the digits MLP.
//
//   mpirun -np 2 build/examples/hyperparameter_search [--epochs N] [--data PATH]
//                                                     [--require-accuracy X]
//
// Each trial is an actor (spread over the ranks) whose run() trains one configuration
// for up to --epochs epochs. Its progress() is in its own concurrency group, so the
// driver reads every trial's validation accuracy while run() goes on. At each rung
// (epochs 2, 4, 8, ...), once every trial still running has reached it, the worse
// half is cancelled: run() sees troupe::this_call::cancelled() at its next batch and gives
// up, and the driver's future fails with troupe::Cancelled. The best configuration
// and what happened to each trial are printed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "digits_dataset.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/actors/this_call.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;

namespace {

struct TrialConfig {
  double lr = 0.1;
  double momentum = 0;
  std::int64_t hidden = 64;
  template <class A>
  void serialize(A& a) {
    a(lr, momentum, hidden);
  }
};

struct Progress {
  int epochs = 0;       // finished
  double accuracy = 0;  // on the validation split, after the last finished epoch
  std::vector<double> by_epoch;
  template <class A>
  void serialize(A& a) {
    a(epochs, accuracy, by_epoch);
  }
};

class Trial {
 public:
  Trial(std::string data, TrialConfig config) : config_(config) {
    const auto split = examples::split_dataset(examples::load_digits(data), 0.2, 1234);
    train_ = split.train;
    validation_ = split.test;
  }

  // Trains for up to `epochs` epochs of batch 32; returns the accuracy after the last.
  double run(int epochs) {
    tensor::Generator gen(7);
    nn::Sequential model;
    model.emplace<nn::Linear>(64, config_.hidden, gen);
    model.emplace<nn::ReLU>();
    model.emplace<nn::Linear>(config_.hidden, 10, gen);
    nn::SGD optimizer(model.named_parameters(), config_.lr, config_.momentum);
    nn::CrossEntropyLoss loss;
    std::vector<std::int64_t> order(static_cast<std::size_t>(train_.size()));
    std::iota(order.begin(), order.end(), 0);
    double accuracy = 0;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      for (std::int64_t begin = 0; begin < train_.size(); begin += 32) {
        this_call::throw_if_cancelled();  // a losing trial stops here
        const auto batch = examples::gather_rows(train_, order, begin, std::min(train_.size(), begin + 32));
        model.zero_grad();
        loss.forward(model.forward(batch.inputs), batch.labels);
        model.backward(loss.backward());
        optimizer.step();
      }
      accuracy = nn::accuracy(model.forward(validation_.inputs), validation_.labels);
      std::lock_guard lock(mutex_);  // progress() reads it from another thread
      progress_.epochs = epoch + 1;
      progress_.accuracy = accuracy;
      progress_.by_epoch.push_back(accuracy);
    }
    return accuracy;
  }

  Progress progress() {
    std::lock_guard lock(mutex_);
    return progress_;
  }

  static constexpr auto troupe_methods = troupe::methods<&Trial::run, &Trial::progress>;
  static constexpr auto troupe_concurrency = troupe::concurrency(troupe::group<1, &Trial::progress>("control"));

 private:
  TrialConfig config_;
  examples::Dataset train_, validation_;
  std::mutex mutex_;
  Progress progress_;
};

struct Flags {
  std::string data = TROUPE_DIGITS_PATH;
  int epochs = 16;
  double require_accuracy = 0;
};

Flags parse_flags(int argc, char** argv) {
  const char* usage = "usage: hyperparameter_search [--data PATH] [--epochs N] [--require-accuracy X]\n";
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      std::cout << usage;
      std::exit(0);
    }
    if (i + 1 >= argc) throw InvalidArgument(flag + " needs a value\n" + usage);
    const std::string value = argv[++i];
    try {
      if (flag == "--data")
        f.data = value;
      else if (flag == "--epochs")
        f.epochs = std::stoi(value);
      else if (flag == "--require-accuracy")
        f.require_accuracy = std::stod(value);
      else
        throw InvalidArgument("unknown flag " + flag + "\n" + usage);
    } catch (const std::logic_error&) {
      throw InvalidArgument("bad value '" + value + "' for " + flag + "\n" + usage);
    }
  }
  if (f.epochs < 2) throw InvalidArgument(std::string("--epochs must be >= 2\n") + usage);
  return f;
}

struct Running {
  TrialConfig config;
  ActorRef<Trial> actor;
  Future<double> result;
  std::string outcome;  // "finished", "cancelled at epoch N" or the error
  Progress last;
  bool cancelled = false;
};

int drive(Runtime& rt, const Flags& flags) {
  std::vector<Running> trials;
  for (const double lr : {0.003, 0.01, 0.03, 0.1, 0.3})
    for (const double momentum : {0.0, 0.9}) trials.push_back({{lr, momentum, 1024}, {}, {}, "", {}, false});
  for (std::size_t i = 0; i < trials.size(); ++i) {
    trials[i].actor =
        rt.spawn<Trial>(static_cast<int>(i % static_cast<std::size_t>(rt.size())), flags.data, trials[i].config);
    trials[i].result = trials[i].actor.ask(&Trial::run, flags.epochs);
  }
  std::printf("%zu trials of up to %d epochs on %d rank(s); rungs at epochs 2, 4, 8, ...\n", trials.size(),
              flags.epochs, rt.size());
  // Successive halving: once every trial still running has reached rung e (2, 4, 8,
  // ...), the worse half of them is cancelled. The trials go on training meanwhile.
  int rung = 2;
  for (bool any_running = true; any_running;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    any_running = false;
    std::vector<Running*> at_rung;
    bool rung_complete = rung <= flags.epochs;
    for (auto& t : trials) {
      if (!t.outcome.empty()) continue;
      if (t.result.ready()) {
        try {
          t.result.get();
          t.outcome = "finished";
        } catch (const Cancelled&) {
          t.outcome = "cancelled after epoch " + std::to_string(t.last.epochs);
        }
        t.last = t.actor.ask(&Trial::progress).get();
        continue;
      }
      any_running = true;
      t.last = t.actor.ask(&Trial::progress).get();
      if (t.cancelled) continue;
      if (t.last.epochs >= rung)
        at_rung.push_back(&t);
      else
        rung_complete = false;
    }
    if (!rung_complete || at_rung.size() < 2) continue;
    std::sort(at_rung.begin(), at_rung.end(), [rung](const Running* a, const Running* b) {
      return a->last.by_epoch[static_cast<std::size_t>(rung - 1)] <
             b->last.by_epoch[static_cast<std::size_t>(rung - 1)];
    });
    for (std::size_t i = 0; i < at_rung.size() / 2; ++i) {
      at_rung[i]->result.cancel();
      at_rung[i]->cancelled = true;
    }
    rung *= 2;
  }
  const auto best = std::max_element(trials.begin(), trials.end(), [](const Running& a, const Running& b) {
    return a.last.accuracy < b.last.accuracy;
  });
  int cancelled = 0;
  for (const auto& t : trials) {
    cancelled += t.outcome.starts_with("cancelled");
    std::printf("  lr %-6g momentum %-4g  %2d epochs  accuracy %.4f  %s%s\n", t.config.lr, t.config.momentum,
                t.last.epochs, t.last.accuracy, t.outcome.c_str(), &t == &*best ? "  <- best" : "");
  }
  int epochs_run = 0;
  for (const auto& t : trials) epochs_run += t.last.epochs;
  std::printf("best: lr %g momentum %g, accuracy %.4f; %d of %zu trials cancelled, %d of %zu epochs run\n",
              best->config.lr, best->config.momentum, best->last.accuracy, cancelled, trials.size(), epochs_run,
              trials.size() * static_cast<std::size_t>(flags.epochs));
  if (best->last.accuracy < flags.require_accuracy) {
    std::fprintf(stderr, "hyperparameter_search: best accuracy %.4f is below --require-accuracy %.4f\n",
                 best->last.accuracy, flags.require_accuracy);
    return 1;
  }
  if (flags.require_accuracy > 0 && cancelled == 0) {
    std::fprintf(stderr, "hyperparameter_search: no trial was cancelled\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A trial's run() holds a pool thread while it trains; enough threads that every
  // trial of a rank runs and progress() still finds one free.
  Runtime rt(argc, argv, RuntimeOptions{.threads = 11});
  int status = 0;
  try {
    const Flags flags = parse_flags(argc, argv);
    if (rt.rank() == 0) status = drive(rt, flags);
  } catch (const std::exception& e) {
    actors::print_error("hyperparameter_search", e, rt.rank());
    status = 2;
  }
  rt.shutdown();
  return status;
}
