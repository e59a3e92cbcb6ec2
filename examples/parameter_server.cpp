// An asynchronous parameter server, Ray's classic actor example, on the digits MLP.
//
//   mpirun -np 3 build/examples/parameter_server [--updates N] [--lr X] [--data PATH]
//                                                [--require-accuracy X]
//
// A ParameterServer actor on rank 0 holds the model and the optimizer. One DataWorker
// actor per rank (rank 0 too when it is alone) holds a copy of the model and its own
// shard of the training set. The driver (main on rank 0) hands each worker the current
// weights; whichever worker answers first with a gradient has it applied at once, and
// gets the new weights back for its next batch — no worker waits for the slowest one,
// so gradients may be computed on slightly stale weights (Hogwild-style asynchronous
// SGD). Weights and gradients travel as troupe::Bytes attachments: a flat f32 buffer,
// sent from the sender's memory without serialising each number.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "digits_dataset.hpp"
#include "troupe/actors/bytes.hpp"
#include "troupe/actors/runtime.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/loss.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;

namespace {

constexpr int kHidden = 128;

std::unique_ptr<nn::Sequential> make_model(std::uint64_t seed) {
  tensor::Generator gen(seed);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Linear>(64, kHidden, gen);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Linear>(kHidden, 10, gen);
  return model;
}

// All parameters (or their gradients), in named_parameters() order, as one f32 buffer.
Bytes flatten(nn::Module& model, bool gradients) {
  std::size_t total = 0;
  for (auto& p : model.named_parameters()) total += static_cast<std::size_t>(p.param->data.numel());
  std::vector<std::byte> flat(total * sizeof(float));
  std::size_t offset = 0;
  for (auto& p : model.named_parameters()) {
    const tensor::Tensor& t = gradients ? p.param->grad : p.param->data;
    const std::size_t bytes = static_cast<std::size_t>(p.param->data.numel()) * sizeof(float);
    if (t.defined()) std::memcpy(flat.data() + offset, t.raw_data(), bytes);  // an undefined grad is zero
    offset += bytes;
  }
  return Bytes(std::move(flat));
}

// The inverse of flatten(), into the parameters or their gradients.
void unflatten(nn::Module& model, const Bytes& flat, bool gradients) {
  std::size_t offset = 0;
  for (auto& p : model.named_parameters()) {
    const std::size_t bytes = static_cast<std::size_t>(p.param->data.numel()) * sizeof(float);
    TROUPE_CHECK(offset + bytes <= flat.size(), "parameter_server: buffer of ", flat.size(), " bytes is too short for ",
                 p.name);
    tensor::Tensor& t = gradients ? p.param->grad : p.param->data;
    if (!t.defined()) t = tensor::Tensor::zeros(p.param->data.shape());
    std::memcpy(t.raw_data(), flat.data() + offset, bytes);
    offset += bytes;
  }
  TROUPE_CHECK(offset == flat.size(), "parameter_server: buffer of ", flat.size(), " bytes, model needs ", offset);
}

class ParameterServer {
 public:
  ParameterServer(std::string data, double lr, std::uint64_t seed)
      : model_(make_model(seed)),
        optimizer_(model_->named_parameters(), lr, /*momentum=*/0.0),
        test_(examples::split_dataset(examples::load_digits(data), 0.2, 1234).test) {}

  Bytes weights() { return flatten(*model_, false); }

  // Applies one worker's gradient and returns the weights after the step.
  Bytes apply_gradient(Bytes gradient) {
    unflatten(*model_, gradient, true);
    optimizer_.step();
    ++updates_;
    return weights();
  }

  double test_accuracy() { return nn::accuracy(model_->forward(test_.inputs), test_.labels); }
  std::int64_t updates() const { return updates_; }

  static constexpr auto troupe_methods = troupe::methods<&ParameterServer::weights, &ParameterServer::apply_gradient,
                                                         &ParameterServer::test_accuracy, &ParameterServer::updates>;

 private:
  std::unique_ptr<nn::Sequential> model_;
  nn::SGD optimizer_;
  examples::Dataset test_;
  std::int64_t updates_ = 0;
};

class DataWorker {
 public:
  // Worker `index` of `count` takes every count-th training sample.
  DataWorker(std::string data, int index, int count, int batch) : model_(make_model(0)), batch_(batch) {
    const auto train = examples::split_dataset(examples::load_digits(data), 0.2, 1234).train;
    std::vector<std::int64_t> mine;
    for (std::int64_t i = index; i < train.size(); i += count) mine.push_back(i);
    shard_ = examples::gather_rows(train, mine, 0, static_cast<std::int64_t>(mine.size()));
  }

  // The mean gradient of the loss over the next batch of this worker's shard, at `weights`.
  Bytes gradient(Bytes weights) {
    unflatten(*model_, weights, false);
    const std::int64_t n = shard_.size();
    const std::int64_t begin = next_ % n, end = std::min(n, begin + batch_);
    next_ = end % n;
    std::vector<std::int64_t> rows(static_cast<std::size_t>(end - begin));
    std::iota(rows.begin(), rows.end(), begin);
    const examples::Dataset batch = examples::gather_rows(shard_, rows, 0, end - begin);
    model_->zero_grad();
    loss_.forward(model_->forward(batch.inputs), batch.labels);
    model_->backward(loss_.backward());
    return flatten(*model_, true);
  }

  static constexpr auto troupe_methods = troupe::methods<&DataWorker::gradient>;

 private:
  std::unique_ptr<nn::Sequential> model_;
  nn::CrossEntropyLoss loss_;
  examples::Dataset shard_;
  std::int64_t batch_;
  std::int64_t next_ = 0;
};

struct Flags {
  std::string data = TROUPE_DIGITS_PATH;
  int updates = 1500;
  int batch = 32;
  double lr = 0.1;
  double require_accuracy = 0;
};

Flags parse_flags(int argc, char** argv) {
  const char* usage =
      "usage: parameter_server [--data PATH] [--updates N] [--batch N] [--lr X] [--require-accuracy X]\n";
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
      else if (flag == "--updates")
        f.updates = std::stoi(value);
      else if (flag == "--batch")
        f.batch = std::stoi(value);
      else if (flag == "--lr")
        f.lr = std::stod(value);
      else if (flag == "--require-accuracy")
        f.require_accuracy = std::stod(value);
      else
        throw InvalidArgument("unknown flag " + flag + "\n" + usage);
    } catch (const std::logic_error&) {
      throw InvalidArgument("bad value '" + value + "' for " + flag + "\n" + usage);
    }
  }
  if (f.updates < 1 || f.batch < 1 || !(f.lr > 0)) throw InvalidArgument(std::string("bad flags\n") + usage);
  return f;
}

int drive(Runtime& rt, const Flags& flags) {
  auto server = rt.spawn<ParameterServer>(0, flags.data, flags.lr, std::uint64_t{0});
  // Workers on every rank but the server's, unless the server's rank is all there is.
  std::vector<ActorRef<DataWorker>> workers;
  const int first = rt.size() > 1 ? 1 : 0;
  for (int r = first; r < rt.size(); ++r) {
    workers.push_back(rt.spawn<DataWorker>(r, flags.data, r - first, rt.size() - first, flags.batch));
  }
  std::printf("parameter server on rank 0, %zu data worker(s) on ranks %d..%d, %d updates of batch %d\n",
              workers.size(), first, rt.size() - 1, flags.updates, flags.batch);
  const Bytes start = server.ask(&ParameterServer::weights).get();
  std::vector<Future<Bytes>> in_flight;
  for (auto& w : workers) in_flight.push_back(w.ask(&DataWorker::gradient, start));
  for (int update = 1; update <= flags.updates; ++update) {
    const std::size_t i = when_any(in_flight).get();
    const Bytes weights = server.ask(&ParameterServer::apply_gradient, in_flight[i].get()).get();
    in_flight[i] = workers[i].ask(&DataWorker::gradient, weights);
    if (update % 250 == 0 || update == flags.updates) {
      std::printf("update %5d  test accuracy %.4f\n", update, server.ask(&ParameterServer::test_accuracy).get());
      std::fflush(stdout);
    }
  }
  for (auto& f : in_flight) f.get();  // let the last gradients land before shutdown
  const double accuracy = server.ask(&ParameterServer::test_accuracy).get();
  std::printf("final test accuracy %.4f after %lld updates\n", accuracy,
              static_cast<long long>(server.ask(&ParameterServer::updates).get()));
  return accuracy >= flags.require_accuracy ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse_flags(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "parameter_server: " << e.what();
    return 2;
  }
  Runtime rt(argc, argv);
  int status = 0;
  if (rt.rank() == 0) {
    try {
      status = drive(rt, flags);
    } catch (const std::exception& e) {
      std::cerr << "parameter_server: error: " << e.what() << "\n";
      status = 1;
    }
  }
  rt.shutdown();
  return status;
}
