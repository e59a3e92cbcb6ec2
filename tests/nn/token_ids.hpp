// Random token ids for the transformer tests: [batch, time] i64 in [0, vocab), a
// function of the seed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "troupe/tensor/random.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::nn::testing {

inline tensor::Tensor token_ids(std::int64_t batch, std::int64_t time, std::int64_t vocab, std::uint64_t seed) {
  tensor::Generator gen(seed);
  const tensor::Tensor u = tensor::uniform({batch, time}, 0.0, static_cast<double>(vocab), gen, tensor::DType::f64);
  std::vector<std::int64_t> ids;
  for (double v : u.to_vector<double>()) ids.push_back(std::min<std::int64_t>(static_cast<std::int64_t>(v), vocab - 1));
  return tensor::Tensor::from_vector(ids, {batch, time});
}

}  // namespace troupe::nn::testing
