// Data-parallel training with checkpoints, against an installed troupe: a small MLP
// learns to tell four Gaussian blobs apart. One TrainWorker actor per rank; rank 0
// drives the epochs. Under troupe-run (TROUPE_CHECKPOINT_DIR set) it saves every 10
// steps and resumes from the newest checkpoint after a crash.
//   mpirun -np 2 ./train_blobs [EPOCHS]
//   troupe-run -np 2 --checkpoint-dir runs/blobs -- ./train_blobs
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "troupe/actors/runtime.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/nn/sgd.hpp"
#include "troupe/tensor/random.hpp"
#include "troupe/train/train_worker.hpp"

using namespace troupe;

// 4 blobs in 2-D, centred on the corners of a square; the same on every rank (seeded).
train::TensorDataset blobs(std::int64_t n, std::uint64_t seed) {
  tensor::Generator gen(seed);
  const Tensor noise = tensor::normal({n, 2}, 0.0, 1.0, gen);
  std::vector<float> points(static_cast<std::size_t>(2 * n));
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  const float* z = noise.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    labels[k] = i % 4;
    points[2 * k] = (labels[k] & 1 ? 2.0f : -2.0f) + 0.7f * z[2 * k];
    points[2 * k + 1] = (labels[k] & 2 ? 2.0f : -2.0f) + 0.7f * z[2 * k + 1];
  }
  return {Tensor::from_vector(points, {n, 2}), Tensor::from_vector(labels)};
}

struct BlobsRecipe {
  struct Config {
    std::int64_t hidden = 32;
    template <class A>
    void serialize(A& a) {
      a(hidden);
    }
  };
  static train::TensorDataset train_set(const Config&) { return blobs(2048, 1); }
  static train::TensorDataset test_set(const Config&) { return blobs(512, 2); }
  static std::unique_ptr<nn::Module> make_model(const Config& c) {
    tensor::Generator gen(0);
    auto model = std::make_unique<nn::Sequential>();
    model->emplace<nn::Linear>(2, c.hidden, gen);
    model->emplace<nn::ReLU>();
    model->emplace<nn::Linear>(c.hidden, 4, gen);
    return model;
  }
  static std::unique_ptr<nn::Optimizer> make_optimizer(nn::Module& model, const Config&) {
    return std::make_unique<nn::SGD>(model.named_parameters(), 0.05, 0.9);
  }
};
using Worker = train::TrainWorker<BlobsRecipe>;

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 5;
  if (epochs < 1) {
    std::fprintf(stderr, "usage: train_blobs [EPOCHS >= 1]\n");
    return 2;
  }
  Runtime runtime(argc, argv);
  const char* checkpoints = std::getenv("TROUPE_CHECKPOINT_DIR");
  int status = 0;
  try {
    auto workers = runtime.spawn_on_each<Worker>(train::WorkerOptions{.global_batch = 64,
                                                                      .epochs = epochs,
                                                                      .progress = false,
                                                                      .checkpoint_dir = checkpoints ? checkpoints : "",
                                                                      .save_every = checkpoints ? 10 : 0},
                                                 BlobsRecipe::Config{});
    if (runtime.rank() == 0) {
      const auto resumed = when_all(workers.ask(&Worker::resume)).get()[0];
      if (resumed.step > 0) std::printf("resumed at step %lld\n", static_cast<long long>(resumed.step));
      const std::int64_t first = resumed.epoch_finished ? resumed.epoch + 1 : std::max<std::int64_t>(1, resumed.epoch);
      double accuracy = 0;
      for (std::int64_t epoch = first; epoch <= epochs; ++epoch) {
        when_all(workers.ask(&Worker::train_epoch, epoch)).get();
        double correct = 0;
        std::int64_t samples = 0;
        for (const auto& e : when_all(workers.ask(&Worker::evaluate)).get()) {
          correct += e.metric("correct");
          samples += e.samples;
        }
        accuracy = correct / static_cast<double>(samples);
        std::printf("epoch %lld: test accuracy %.4f\n", static_cast<long long>(epoch), accuracy);
      }
      const auto state = when_all(workers.ask(&Worker::state)).get()[0];
      std::printf("final test accuracy %.4f, parameters hash %016llx (%lld steps, %d rank(s))\n", accuracy,
                  static_cast<unsigned long long>(state.parameter_hash), static_cast<long long>(state.step),
                  runtime.size());
      when_all(workers.ask(&Worker::stop)).get();
    }
  } catch (const std::exception& e) {
    print_error("train_blobs", e, runtime.rank());
    status = 1;
  }
  runtime.shutdown();
  return status;
}
