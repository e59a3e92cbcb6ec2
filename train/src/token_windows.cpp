#include "troupe/train/token_windows.hpp"

#include <cstring>

#include "troupe/error.hpp"

namespace troupe::train {

TokenWindows::TokenWindows(Tensor tokens, std::int64_t block_size, std::int64_t stride)
    : tokens_(std::move(tokens)), block_size_(block_size), stride_(stride == 0 ? block_size : stride) {
  tokens_.check_defined("TokenWindows");
  TROUPE_CHECK(tokens_.dim() == 1 && tokens_.dtype() == tensor::DType::i64 && tokens_.device().is_cpu(),
               "TokenWindows: tokens must be an i64 vector on the CPU, got ", tensor::to_string(tokens_.shape()), " ",
               tensor::dtype_name(tokens_.dtype()));
  TROUPE_CHECK(block_size_ >= 1 && stride_ >= 1, "TokenWindows: block_size and stride must be >= 1, got ", block_size_,
               " and ", stride_);
  const std::int64_t n = tokens_.numel();
  TROUPE_CHECK(n >= block_size_ + 1, "TokenWindows: a block size of ", block_size_, " needs at least ", block_size_ + 1,
               " tokens, the stream has ", n);
  windows_ = (n - block_size_ - 1) / stride_ + 1;
}

TensorBatch TokenWindows::rows(const std::vector<std::int64_t>& indices) const {
  const auto count = static_cast<std::int64_t>(indices.size());
  Tensor inputs = Tensor::empty({count, block_size_}, tensor::DType::i64);
  Tensor targets = Tensor::empty({count, block_size_}, tensor::DType::i64);
  const auto* src = tokens_.data<std::int64_t>();
  auto* in = inputs.data<std::int64_t>();
  auto* out = targets.data<std::int64_t>();
  const auto bytes = static_cast<std::size_t>(block_size_) * sizeof(std::int64_t);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t w = indices[static_cast<std::size_t>(i)];
    TROUPE_CHECK(w >= 0 && w < windows_, "TokenWindows: window ", w, " (position ", i, ") is outside [0, ", windows_,
                 ")");
    std::memcpy(in + i * block_size_, src + w * stride_, bytes);
    std::memcpy(out + i * block_size_, src + w * stride_ + 1, bytes);
  }
  return {std::move(inputs), std::move(targets)};
}

}  // namespace troupe::train
