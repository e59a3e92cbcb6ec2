// What the train tests share: the world communicator (single-rank backend with one
// rank, MPI otherwise, exactly what a training program gets), a small MLP and
// seeded data, and helpers to compare parameters across runs and ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/collectives/communicator.hpp"
#include "troupe/nn/sequential.hpp"
#include "troupe/peak_rss.hpp"
#include "troupe/train/tensor_dataset.hpp"

namespace troupe::train::testing {

collectives::Communicator& world();
void release_world();

// 16-32-32-4 with ReLU, initialised from `seed`.
std::unique_ptr<nn::Sequential> make_mlp(std::uint64_t seed);
// `n` samples of 16 inputs in [-1, 1) and labels in [0, 4), from `seed`.
TensorDataset make_data(std::int64_t n, std::uint64_t seed);

// 64-bit FNV-1a over every parameter's bytes, in named order.
std::uint64_t parameter_hash(nn::Module& model);
// Every parameter's values, flattened in named order, as doubles.
std::vector<double> flat_parameters(nn::Module& model);
// max |a - b| / max(|b|, 1e-3) over elements.
double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b);
// True when every rank passed the same hash.
bool same_on_every_rank(std::uint64_t hash);

// Peak-RSS measurement (troupe/peak_rss.hpp).
using troupe::proc_status_bytes;
using troupe::reset_peak_rss;

}  // namespace troupe::train::testing
