// The CUDA side of the tensor module, as plain functions over raw pointers so that
// only cuda_backend.cu and cuda_matmul.cpp see the CUDA headers. In a build without
// the toolkit, cuda_absent.cpp defines the same functions and each one throws.
#pragma once

#include <cstddef>
#include <cstdint>

#include "troupe/tensor/dtype.hpp"

namespace troupe::tensor::cuda_backend {

enum class CopyKind { host_to_device, device_to_host, device_to_device };
enum class BinaryOp { add, sub, mul, div };

int device_count();
void* allocate(std::size_t nbytes, int device);
void release(void* data, int device);
void copy(void* dst, const void* src, std::size_t nbytes, CopyKind kind);
void fill(void* data, DType dtype, std::int64_t n, double value);
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n);
// out = a op b elementwise, all n long; b_is_scalar reads b[0] for every element.
void binary(BinaryOp op, DType dtype, const void* a, const void* b, bool b_is_scalar, void* out,
            std::int64_t n);
void axpy(DType dtype, void* y, double alpha, const void* x, std::int64_t n);
void scale(DType dtype, void* data, double alpha, std::int64_t n);
void random_uniform(DType dtype, void* out, std::int64_t n, std::uint64_t seed,
                    std::uint64_t offset, double lo, double hi);
void random_normal(DType dtype, void* out, std::int64_t n, std::uint64_t seed,
                   std::uint64_t offset, double mean, double std);
// Row-major C[m,n] = alpha * op(A) op(B) + beta * C, through cuBLAS.
void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, double alpha, const void* a, const void* b, double beta, void* c);

}  // namespace troupe::tensor::cuda_backend
