// Every CUDA runtime and cuBLAS call goes through one of these, so a failure names
// the call, the library's own message and where it happened.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "troupe/error.hpp"

namespace troupe::tensor::cuda_backend {

inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    ::troupe::detail::fail<Error>(file, line, "CUDA: ", call, " failed: ", cudaGetErrorName(status), ": ",
                                  cudaGetErrorString(status));
}

inline void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    ::troupe::detail::fail<Error>(file, line, "cuBLAS: ", call, " failed with status ", static_cast<int>(status));
}

}  // namespace troupe::tensor::cuda_backend

#define TROUPE_CUDA_CHECK(call) ::troupe::tensor::cuda_backend::cuda_check((call), #call, __FILE__, __LINE__)
#define TROUPE_CUBLAS_CHECK(call) ::troupe::tensor::cuda_backend::cublas_check((call), #call, __FILE__, __LINE__)
