// Trains an MLP (64-256-256-10) on the UCI digits set, in one process.
//
//   build/examples/train_digits --epochs 30
//
// Reads top to bottom: flags, data, model, optimizer, the epoch loop. Later issues
// run the same loop across ranks (DDP) and under the supervisor with checkpoints.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <string>

#include "digits_dataset.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/ops.hpp"

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
};

const char* kUsage =
    "usage: train_digits [--data PATH] [--epochs N] [--batch-size N] [--hidden N] [--lr X]\n"
    "                    [--momentum X] [--seed N] [--require-accuracy X]\n";

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (i + 1 >= argc) throw InvalidArgument(flag + " needs a value\n" + kUsage);
    const std::string value = argv[++i];
    try {
      std::size_t used = 0;
      auto whole = [&](auto parsed) {
        if (used != value.size()) throw std::invalid_argument(value);
        return parsed;
      };
      if (flag == "--data") f.data = value;
      else if (flag == "--epochs") f.epochs = whole(std::stoi(value, &used));
      else if (flag == "--batch-size") f.batch_size = whole(std::stoi(value, &used));
      else if (flag == "--hidden") f.hidden = whole(std::stoi(value, &used));
      else if (flag == "--lr") f.lr = whole(std::stod(value, &used));
      else if (flag == "--momentum") f.momentum = whole(std::stod(value, &used));
      else if (flag == "--seed") f.seed = whole(std::stoull(value, &used));
      else if (flag == "--require-accuracy") f.require_accuracy = whole(std::stod(value, &used));
      else throw InvalidArgument("unknown flag " + flag + "\n" + kUsage);
    } catch (const std::logic_error&) {  // stoi/stod: not a number, or out of range
      throw InvalidArgument("bad value '" + value + "' for " + flag + "\n" + kUsage);
    }
  }
  if (f.epochs < 1 || f.batch_size < 1 || f.hidden < 1 || !(f.lr > 0))
    throw InvalidArgument(std::string("--epochs, --batch-size and --hidden must be >= 1 and --lr > 0\n") + kUsage);
  return f;
}

// Mean loss and accuracy of `model` over `data`, in batches, in eval mode.
std::pair<double, double> evaluate(nn::Module& model, const examples::Dataset& data, int batch_size) {
  model.eval();
  nn::CrossEntropyLoss loss_fn;
  double loss = 0, correct = 0;
  for (std::int64_t begin = 0; begin < data.size(); begin += batch_size) {
    const auto end = std::min<std::int64_t>(begin + batch_size, data.size());
    const Tensor logits = model.forward(data.inputs.slice(begin, end));
    const Tensor labels = data.labels.slice(begin, end);
    loss += loss_fn.forward(logits, labels).item() * static_cast<double>(end - begin);
    correct += nn::accuracy(logits, labels) * static_cast<double>(end - begin);
  }
  model.train();
  return {loss / static_cast<double>(data.size()), correct / static_cast<double>(data.size())};
}

int run(const Flags& flags) {
  tensor::set_num_threads(1);

  // Data: a fixed, seeded 80/20 split, pixels scaled to [0, 1].
  const examples::Dataset all = examples::load_digits(flags.data);
  const examples::DigitsSplit split = examples::split_dataset(all, 0.2, /*seed=*/1234);
  std::printf("digits: %lld train, %lld test samples from %s\n", static_cast<long long>(split.train.size()),
              static_cast<long long>(split.test.size()), flags.data.c_str());

  // Model: 64-256-256-10 with ReLU, PyTorch's default initialisation.
  tensor::Generator gen(flags.seed);
  nn::Sequential model;
  model.emplace<nn::Linear>(64, flags.hidden, gen);
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(flags.hidden, flags.hidden, gen);
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(flags.hidden, 10, gen);
  std::printf("model: %lld parameters; SGD lr %.3g momentum %.3g; batch %d\n",
              static_cast<long long>(model.parameter_count()), flags.lr, flags.momentum, flags.batch_size);

  nn::SGD optimizer(model.named_parameters(), flags.lr, flags.momentum);
  nn::CrossEntropyLoss loss_fn;
  std::vector<std::int64_t> order(static_cast<std::size_t>(split.train.size()));
  std::mt19937_64 shuffle_rng(flags.seed);

  double test_accuracy = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 1; epoch <= flags.epochs; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[shuffle_rng() % i]);
    const auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    for (std::int64_t begin = 0; begin < split.train.size(); begin += flags.batch_size) {
      const auto end = std::min<std::int64_t>(begin + flags.batch_size, split.train.size());
      const examples::Dataset batch = examples::gather_rows(split.train, order, begin, end);
      optimizer.zero_grad();
      const Tensor logits = model.forward(batch.inputs);
      loss_sum += loss_fn.forward(logits, batch.labels).item() * static_cast<double>(end - begin);
      model.backward(loss_fn.backward());
      optimizer.step();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    const auto [test_loss, accuracy] = evaluate(model, split.test, 256);
    test_accuracy = accuracy;
    std::printf("epoch %3d/%d  loss %.4f  test loss %.4f  test acc %.4f  %8.0f samples/s\n", epoch, flags.epochs,
                loss_sum / static_cast<double>(split.train.size()), test_loss, test_accuracy,
                static_cast<double>(split.train.size()) / seconds);
    std::fflush(stdout);
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("final test accuracy %.4f after %d epochs (%.2f s)\n", test_accuracy, flags.epochs, total);
  if (test_accuracy < flags.require_accuracy) {
    std::fprintf(stderr, "train_digits: test accuracy %.4f is below the required %.4f\n", test_accuracy,
                 flags.require_accuracy);
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_flags(argc, argv));
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "train_digits: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_digits: error: %s\n", e.what());
    return 1;
  }
}
