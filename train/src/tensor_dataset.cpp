#include "troupe/train/tensor_dataset.hpp"

#include <cstring>

#include "troupe/error.hpp"

namespace troupe::train {

Tensor gather_rows(const Tensor& source, const std::vector<std::int64_t>& indices) {
  source.check_defined("gather_rows");
  TROUPE_CHECK(source.dim() >= 1, "gather_rows: source must have a row dimension, got a 0-dim tensor");
  TROUPE_CHECK(source.device().is_cpu(), "gather_rows: source must be on the CPU");
  Shape shape = source.shape();
  const std::int64_t rows = shape[0];
  shape[0] = static_cast<std::int64_t>(indices.size());
  Tensor out = Tensor::empty(shape, source.dtype());
  const std::size_t row_bytes = rows > 0 ? source.nbytes() / static_cast<std::size_t>(rows) : 0;
  const auto* src = static_cast<const std::byte*>(source.raw_data());
  auto* dst = static_cast<std::byte*>(out.raw_data());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const std::int64_t row = indices[i];
    TROUPE_CHECK(row >= 0 && row < rows, "gather_rows: index ", row, " (position ", i, ") is outside [0, ", rows, ")");
    std::memcpy(dst + i * row_bytes, src + static_cast<std::size_t>(row) * row_bytes, row_bytes);
  }
  return out;
}

TensorDataset::TensorDataset(Tensor in, Tensor tg) : inputs(std::move(in)), targets(std::move(tg)) {
  inputs.check_defined("TensorDataset");
  targets.check_defined("TensorDataset");
  TROUPE_CHECK(inputs.dim() >= 1 && targets.dim() >= 1 && inputs.size(0) == targets.size(0), "TensorDataset: inputs ",
               tensor::to_string(inputs.shape()), " and targets ", tensor::to_string(targets.shape()),
               " must have the same number of rows");
}

TensorBatch TensorDataset::rows(const std::vector<std::int64_t>& indices) const {
  return {gather_rows(inputs, indices), gather_rows(targets, indices)};
}

}  // namespace troupe::train
