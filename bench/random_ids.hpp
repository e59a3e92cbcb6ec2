// Random token ids for the GPT bench programs (gpt_bench, mesh_bench).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "troupe/tensor/random.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::bench {

// i64 ids [batch, time], uniform over [0, vocab), from `gen`.
inline tensor::Tensor random_ids(std::int64_t batch, std::int64_t time, std::int64_t vocab, tensor::Generator& gen) {
  const tensor::Tensor u = tensor::uniform({batch, time}, 0.0, static_cast<double>(vocab), gen, tensor::DType::f64);
  std::vector<std::int64_t> ids;
  for (double v : u.to_vector<double>()) ids.push_back(std::min<std::int64_t>(static_cast<std::int64_t>(v), vocab - 1));
  return tensor::Tensor::from_vector(ids, {batch, time});
}

}  // namespace troupe::bench
