// TensorDataset: a data set held as tensors whose dim 0 indexes samples (inputs
// [n, ...] and targets [n, ...]), and the collation of a batch from sample indices.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/tensor/tensor.hpp"

namespace troupe::train {

// Rows `indices` of `source` (dim 0), copied into a new contiguous tensor, in order.
// An index outside [0, rows) is an InvalidArgument naming it.
Tensor gather_rows(const Tensor& source, const std::vector<std::int64_t>& indices);

struct TensorBatch {
  Tensor inputs;
  Tensor targets;
  std::int64_t size() const { return targets.defined() ? targets.size(0) : 0; }
};

struct TensorDataset {
  Tensor inputs;
  Tensor targets;

  TensorDataset() = default;
  // Both must have the same number of rows (checked).
  TensorDataset(Tensor inputs, Tensor targets);
  std::int64_t size() const { return targets.defined() ? targets.size(0) : 0; }
  // The batch of these samples: a DataLoader's collate function.
  TensorBatch rows(const std::vector<std::int64_t>& indices) const;
};

}  // namespace troupe::train
