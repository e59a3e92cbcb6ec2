// TrainWorker::status() answers while train_epoch runs (issue 52: the "control"
// concurrency group). Rank 0 drives one epoch on every rank and polls each worker's
// status meanwhile; exits non-zero, saying why, when a status waited behind the epoch
// or said something wrong.
//
//   mpirun -np 2 worker_status_test
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/runtime.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/train_worker.hpp"
#include "troupe/train/worker_driver.hpp"

using namespace troupe;
using Clock = std::chrono::steady_clock;

namespace {

// Points on a line, labelled by side: enough samples that an epoch of small batches
// lasts about a second.
train::TensorDataset line_points(std::int64_t n, std::uint64_t seed) {
  tensor::Generator gen(seed);
  const Tensor x = tensor::normal({n, 2}, 0.0, 1.0, gen);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  const float* p = x.data<float>();
  for (std::int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = p[2 * i] + p[2 * i + 1] > 0 ? 1 : 0;
  return {x, Tensor::from_vector(labels)};
}

struct LineRecipe {
  struct Config {
    std::int64_t samples = 0;
    template <class A>
    void serialize(A& a) {
      a(samples);
    }
  };
  static train::TensorDataset train_set(const Config& c) { return line_points(c.samples, 1); }
  static train::TensorDataset test_set(const Config&) { return line_points(64, 2); }
  static std::unique_ptr<nn::Module> make_model(const Config&) {
    tensor::Generator gen(0);
    auto model = std::make_unique<nn::Sequential>();
    model->emplace<nn::Linear>(2, 64, gen);
    model->emplace<nn::ReLU>();
    model->emplace<nn::Linear>(64, 2, gen);
    return model;
  }
  static std::unique_ptr<nn::Optimizer> make_optimizer(nn::Module& model, const Config&) {
    return std::make_unique<nn::SGD>(model.named_parameters(), 0.05, 0.9);
  }
};
using Worker = train::TrainWorker<LineRecipe>;

int drive(const actors::ActorGroup<Worker>& workers) {
  std::vector<std::string> failures;
  auto epoch = when_all(workers.ask(&Worker::train_epoch, 0));
  const auto began = Clock::now();
  int answered = 0;
  double slowest = 0;
  std::int64_t last_step = -1, furthest = 0;
  std::vector<bool> seen_running(workers.size(), false);
  bool saw_loss = false;
  while (!epoch.ready()) {
    for (const auto& worker : workers) {
      const auto start = Clock::now();
      const train::WorkerStatus s = worker.ask(&Worker::status).get();
      slowest = std::max(slowest, std::chrono::duration<double>(Clock::now() - start).count());
      if (epoch.ready()) break;  // the answer may have come after the epoch ended
      ++answered;
      // Nothing runs on a rank before its epoch begins or after it ends there.
      if (s.running == "train_epoch") {
        seen_running.at(static_cast<std::size_t>(worker.rank())) = true;
        furthest = std::max(furthest, s.step);
        if (s.last_loss > 0) saw_loss = true;
      } else if (!s.running.empty()) {
        failures.push_back("status said running '" + s.running + "' during the epoch");
      }
      if (s.rank != worker.rank())
        failures.push_back("status of rank " + std::to_string(worker.rank()) + " said rank " + std::to_string(s.rank));
      if (worker.rank() == 0) {
        if (s.step < last_step) failures.push_back("the step went back");
        last_step = s.step;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // leave the cores to the training
  }
  const double epoch_s = std::chrono::duration<double>(Clock::now() - began).count();
  epoch.get();
  const std::int64_t final_step = workers[0].ask(&Worker::status).get().step;
  std::printf(
      "worker_status_test: %d status answers during a %.2f s epoch, the slowest in %.1f ms; step %lld of %lld\n",
      answered, epoch_s, slowest * 1e3, static_cast<long long>(furthest), static_cast<long long>(final_step));
  if (answered < 3 * static_cast<int>(workers.size()))
    failures.push_back("only " + std::to_string(answered) + " status answers during the epoch");
  if (slowest > 0.5 * epoch_s) failures.push_back("a status waited for the epoch");
  if (furthest <= 0 || furthest >= final_step) failures.push_back("no step in progress was seen");
  for (std::size_t r = 0; r < seen_running.size(); ++r)
    if (!seen_running[r]) failures.push_back("rank " + std::to_string(r) + " was never seen in train_epoch");
  if (!saw_loss) failures.push_back("no loss was published during the epoch");
  for (const auto& worker : workers) {
    const train::WorkerStatus s = worker.ask(&Worker::status).get();
    if (!s.running.empty() || s.step != final_step || !std::isfinite(s.last_loss))
      failures.push_back("after the epoch, rank " + std::to_string(s.rank) + " said running '" + s.running +
                         "', step " + std::to_string(s.step) + ", loss " + std::to_string(s.last_loss));
  }
  try {  // refused before anything is sent: a collective on one rank would hang the others
    (void)workers[0].ask(actors::Deadline::in(std::chrono::seconds(1)), &Worker::state);
    failures.push_back("a deadline on state(), a collective, was accepted");
  } catch (const InvalidArgument&) {
  }
  for (const auto& f : failures) std::fprintf(stderr, "worker_status_test: FAILED: %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Runtime runtime(argc, argv);
  int status = 0;
  try {
    train::WorkerOptions options;
    options.global_batch = 16;
    options.epochs = 2;
    options.progress = false;
    auto workers = runtime.spawn_on_each<Worker>(options, LineRecipe::Config{200000});
    status = train::drive_then_stop(workers, runtime.rank(), [&] { return drive(workers); });
  } catch (const std::exception& e) {
    actors::print_error("worker_status_test", e, runtime.rank());
    status = 1;
  }
  runtime.shutdown();
  return status;
}
