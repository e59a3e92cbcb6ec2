#include "troupe/nn/embedding.hpp"

#include <cstring>

#include "troupe/error.hpp"

namespace troupe::nn {

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, tensor::Generator& gen, DType dtype)
    : num_(num_embeddings), dim_(embedding_dim) {
  TROUPE_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be > 0, got ", num_embeddings,
               " x ", embedding_dim);
  TROUPE_CHECK(tensor::is_floating(dtype), "Embedding: needs a floating dtype, got ", dtype);
  weight_ = &register_parameter("weight", tensor::normal({num_, dim_}, 0.0, 1.0, gen, dtype));
}

std::string Embedding::type_name() const {
  return "Embedding(" + std::to_string(num_) + ", " + std::to_string(dim_) + ")";
}

Tensor Embedding::forward(const Tensor& indices) {
  const std::string op = type_name() + ".forward";
  TROUPE_CHECK(indices.defined(), op, ": indices are undefined");
  TROUPE_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32, op,
               ": indices must be i64 or i32, got ", indices.dtype());
  TROUPE_CHECK(indices.device().is_cpu(), op, ": runs on the CPU, indices are on ", indices.device());
  TROUPE_CHECK(weight_->data.device().is_cpu(), op, ": runs on the CPU only (no CUDA kernels yet), its weight is on ",
               weight_->data.device());
  const Tensor idx = indices.to(DType::i64);
  const std::int64_t* ip = idx.data<std::int64_t>();
  for (std::int64_t i = 0; i < idx.numel(); ++i)
    TROUPE_CHECK(ip[i] >= 0 && ip[i] < num_, op, ": index ", ip[i], " at position ", i,
                 " is out of range for a table of ", num_, " rows");
  indices_ = idx;
  Shape out_shape = indices.shape();
  out_shape.push_back(dim_);
  const Tensor& table = weight_->data;
  Tensor out = Tensor::empty(out_shape, table.dtype());
  const std::size_t row_bytes = static_cast<std::size_t>(dim_) * table.element_bytes();
  const auto* src = static_cast<const char*>(table.raw_data());
  auto* dst = static_cast<char*>(out.raw_data());
  for (std::int64_t i = 0; i < idx.numel(); ++i)
    std::memcpy(dst + static_cast<std::size_t>(i) * row_bytes, src + static_cast<std::size_t>(ip[i]) * row_bytes,
                row_bytes);
  return out;
}

Tensor Embedding::backward(const Tensor& grad_output) {
  const std::string op = type_name() + ".backward";
  TROUPE_CHECK(indices_.defined(), op, ": called before forward");
  Shape expected = indices_.shape();
  expected.push_back(dim_);
  TROUPE_CHECK(grad_output.defined() && grad_output.shape() == expected &&
                   grad_output.dtype() == weight_->data.dtype() && grad_output.device().is_cpu(),
               op, ": grad_output must be ", weight_->data.dtype(), " ", tensor::to_string(expected),
               " on the CPU, got ", grad_output.defined() ? tensor::dtype_name(grad_output.dtype()) : "undefined",
               " ", tensor::to_string(grad_output.shape()));
  Tensor& grad = grad_for_accumulation(*weight_, op.c_str(), "weight");
  tensor::dispatch_floating(grad.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    using C = tensor::compute_t<T>;
    const std::int64_t* ip = indices_.data<std::int64_t>();
    const T* gy = grad_output.data<T>();
    T* g = grad.data<T>();
    for (std::int64_t i = 0; i < indices_.numel(); ++i) {
      T* row = g + ip[i] * dim_;
      const T* src = gy + i * dim_;
      for (std::int64_t j = 0; j < dim_; ++j) row[j] = T(static_cast<C>(row[j]) + static_cast<C>(src[j]));
    }
  });
  grad_ready(*weight_);
  return Tensor();
}

}  // namespace troupe::nn
