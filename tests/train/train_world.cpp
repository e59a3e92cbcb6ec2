#include "train_world.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>

#include "troupe/collectives/options.hpp"
#include "troupe/nn/activation.hpp"
#include "troupe/nn/linear.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::train::testing {

namespace {
std::unique_ptr<collectives::Communicator>& world_slot() {
  static std::unique_ptr<collectives::Communicator> world;
  return world;
}
}  // namespace

collectives::Communicator& world() {
  auto& slot = world_slot();
  if (!slot) {
    collectives::Options options = collectives::options_from_environment();
    options.timeout = std::chrono::seconds(30);  // a stuck test fails in seconds, not minutes
    slot = collectives::world_communicator(options);
  }
  return *slot;
}

void release_world() { world_slot().reset(); }

std::unique_ptr<nn::Sequential> make_mlp(std::uint64_t seed) {
  tensor::Generator gen(seed);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Linear>(16, 32, gen);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Linear>(32, 32, gen);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Linear>(32, 4, gen);
  return model;
}

TensorDataset make_data(std::int64_t n, std::uint64_t seed) {
  tensor::Generator gen(seed);
  Tensor inputs = tensor::uniform({n, 16}, -1, 1, gen);
  const Tensor u = tensor::uniform({n}, 0, 4, gen);
  std::vector<std::int64_t> labels;
  for (float v : u.to_vector<float>()) labels.push_back(std::min<std::int64_t>(3, static_cast<std::int64_t>(v)));
  return TensorDataset(inputs, Tensor::from_vector(labels));
}

std::uint64_t parameter_hash(nn::Module& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& [name, p] : model.named_parameters()) {
    const auto* bytes = static_cast<const unsigned char*>(p->data.raw_data());
    for (std::size_t i = 0; i < p->data.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

std::vector<double> flat_parameters(nn::Module& model) {
  std::vector<double> out;
  for (const auto& [name, p] : model.named_parameters()) {
    const auto v = p->data.to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-3));
  return worst;
}

bool same_on_every_rank(std::uint64_t hash) {
  auto& comm = world();
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(hash)};
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(collectives::Buffer(mine), collectives::Buffer(all));
  return std::all_of(all.begin(), all.end(), [&](std::int64_t h) { return h == all[0]; });
}

}  // namespace troupe::train::testing
