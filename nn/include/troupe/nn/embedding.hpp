// Embedding: a lookup table, torch.nn.Embedding(num_embeddings, embedding_dim).
//
// forward takes integer indices (i64, or i32) of any shape and returns the rows
// they select, shaped [..., embedding_dim]. Every index is checked before anything
// is read: one out of [0, num_embeddings) is an error naming the index, its position
// and the table size. weight starts N(0, 1), as in PyTorch.
// backward scatter-adds grad_output's rows into weight.grad (an index seen twice
// gets both rows, added in index order on either device, so CPU and CUDA agree bit
// for bit) and returns an undefined tensor: indices have no gradient. On CUDA the
// indices may be on the host or the GPU; they are range-checked on the host.
#pragma once

#include <cstdint>

#include "troupe/nn/module.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::nn {

class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, tensor::Generator& gen, DType dtype = DType::f32,
            tensor::Device device = tensor::Device::cpu());

  Tensor forward_impl(const Tensor& indices) override;
  Tensor backward_impl(const Tensor& grad_output) override;
  std::string type_name() const override;

  Parameter& weight() { return *weight_; }
  std::int64_t num_embeddings() const { return num_; }
  std::int64_t embedding_dim() const { return dim_; }

 protected:
  void exchange_own_activations(ActivationStash& stash) override;

 private:
  std::int64_t num_, dim_;
  Parameter* weight_ = nullptr;
  Tensor indices_;  // as i64
};

}  // namespace troupe::nn
