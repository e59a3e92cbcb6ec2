// TokenWindows: a token stream read as training samples of block_size + 1 consecutive
// tokens, the (B, T+1) windows a language model trains on. Sample i starts at token
// i * stride: its inputs are tokens [s, s + T) and its targets [s + 1, s + T + 1), the
// next token at every position. With the default stride of T the windows tile the
// stream, so an epoch sees every token once as a target (the last partial window is
// dropped, as nanoGPT's evaluation does).
//
// It is a data set like TensorDataset (size(), rows()), so DistributedSampler shuffles
// the windows, partitions them over the ranks and resumes mid-epoch exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/tensor/tensor.hpp"
#include "troupe/train/tensor_dataset.hpp"

namespace troupe::train {

class TokenWindows {
 public:
  TokenWindows() = default;
  // `tokens` is an i64 vector on the CPU. Throws InvalidArgument when it holds fewer
  // than block_size + 1 tokens, or when block_size or stride is < 1 (stride 0: T).
  TokenWindows(Tensor tokens, std::int64_t block_size, std::int64_t stride = 0);

  std::int64_t size() const { return windows_; }
  std::int64_t block_size() const { return block_size_; }
  std::int64_t stride() const { return stride_; }
  const Tensor& tokens() const { return tokens_; }
  // The windows `indices` as i64 [n, T] inputs and [n, T] targets.
  TensorBatch rows(const std::vector<std::int64_t>& indices) const;

 private:
  Tensor tokens_;
  std::int64_t block_size_ = 0, stride_ = 0, windows_ = 0;
};

}  // namespace troupe::train
