#include "troupe/nn/embedding.hpp"

#include "troupe/error.hpp"
#include "troupe/tensor/nn_ops.hpp"

namespace troupe::nn {

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, tensor::Generator& gen, DType dtype,
                     tensor::Device device)
    : num_(num_embeddings), dim_(embedding_dim) {
  TROUPE_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be > 0, got ", num_embeddings, " x ",
               embedding_dim);
  TROUPE_CHECK(tensor::is_floating(dtype), "Embedding: needs a floating dtype, got ", dtype);
  weight_ = &register_parameter("weight", tensor::normal({num_, dim_}, 0.0, 1.0, gen, dtype, device));
}

std::string Embedding::type_name() const {
  return "Embedding(" + std::to_string(num_) + ", " + std::to_string(dim_) + ")";
}

Tensor Embedding::forward_impl(const Tensor& indices) {
  const std::string op = type_name() + ".forward";
  TROUPE_CHECK(indices.defined(), op, ": indices are undefined");
  TROUPE_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32, op, ": indices must be i64 or i32, got ",
               indices.dtype());
  // Checked on the host (indices on the GPU are copied back), so an error names the index.
  const Tensor idx = indices.to(tensor::Device::cpu()).to(DType::i64);
  const std::int64_t* ip = idx.data<std::int64_t>();
  for (std::int64_t i = 0; i < idx.numel(); ++i)
    TROUPE_CHECK(ip[i] >= 0 && ip[i] < num_, op, ": index ", ip[i], " at position ", i,
                 " is out of range for a table of ", num_, " rows");
  indices_ = idx;
  Shape out_shape = indices.shape();
  out_shape.push_back(dim_);
  return tensor::gather_rows(weight_->data, idx.reshape({idx.numel()})).reshape(out_shape);
}

Tensor Embedding::backward_impl(const Tensor& grad_output) {
  const std::string op = type_name() + ".backward";
  TROUPE_CHECK(indices_.defined(), op, ": called before forward");
  Shape expected = indices_.shape();
  expected.push_back(dim_);
  TROUPE_CHECK(grad_output.defined() && grad_output.shape() == expected &&
                   grad_output.dtype() == weight_->data.dtype() && grad_output.device() == weight_->data.device(),
               op, ": grad_output must be ", weight_->data.dtype(), " ", tensor::to_string(expected), " on ",
               weight_->data.device(), ", got ",
               grad_output.defined() ? tensor::dtype_name(grad_output.dtype()) : "undefined", " ",
               tensor::to_string(grad_output.shape()));
  Tensor& grad = grad_for_accumulation(*weight_, op.c_str(), "weight");
  tensor::scatter_add_rows_(grad, indices_.reshape({indices_.numel()}), grad_output.reshape({indices_.numel(), dim_}));
  grad_ready(*weight_);
  return Tensor();
}

void Embedding::exchange_own_activations(ActivationStash& stash) { stash.exchange(indices_); }

}  // namespace troupe::nn
