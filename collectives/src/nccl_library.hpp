// The CUDA runtime and NCCL functions the NCCL backend calls, fetched with dlopen the
// first time a program asks for an NCCL communicator: a CPU-only program never maps
// libcudart or libnccl (docs/ARCHITECTURE.md, "CUDA on demand"). The headers still
// give the types; each member has the type of the function it names.
#pragma once

#include <cuda_runtime_api.h>  // the C API alone: cuda_runtime.h overloads some of these
#include <nccl.h>

#include <string>

namespace troupe::collectives::detail {

struct NcclLibrary {
  decltype(&::cudaEventCreateWithFlags) cudaEventCreateWithFlags;
  decltype(&::cudaEventDestroy) cudaEventDestroy;
  decltype(&::cudaEventQuery) cudaEventQuery;
  decltype(&::cudaEventRecord) cudaEventRecord;
  decltype(&::cudaFreeAsync) cudaFreeAsync;
  decltype(&::cudaGetDeviceCount) cudaGetDeviceCount;
  decltype(&::cudaGetErrorString) cudaGetErrorString;
  cudaError_t (*cudaMallocAsync)(void**, size_t, cudaStream_t);  // the C overload
  decltype(&::cudaSetDevice) cudaSetDevice;
  decltype(&::cudaStreamCreateWithFlags) cudaStreamCreateWithFlags;
  decltype(&::cudaStreamDestroy) cudaStreamDestroy;
  decltype(&::cudaStreamWaitEvent) cudaStreamWaitEvent;

  decltype(&::ncclAllGather) ncclAllGather;
  decltype(&::ncclAllReduce) ncclAllReduce;
  decltype(&::ncclBroadcast) ncclBroadcast;
  decltype(&::ncclCommAbort) ncclCommAbort;
  decltype(&::ncclCommCount) ncclCommCount;
  decltype(&::ncclCommDestroy) ncclCommDestroy;
  decltype(&::ncclCommGetAsyncError) ncclCommGetAsyncError;
  decltype(&::ncclCommInitRank) ncclCommInitRank;
  decltype(&::ncclCommSplit) ncclCommSplit;
  decltype(&::ncclCommUserRank) ncclCommUserRank;
  decltype(&::ncclGetErrorString) ncclGetErrorString;
  decltype(&::ncclGetUniqueId) ncclGetUniqueId;
  decltype(&::ncclGroupEnd) ncclGroupEnd;
  decltype(&::ncclGroupStart) ncclGroupStart;
  decltype(&::ncclRecv) ncclRecv;
  decltype(&::ncclReduce) ncclReduce;
  decltype(&::ncclReduceScatter) ncclReduceScatter;
  decltype(&::ncclSend) ncclSend;
};

// The loaded library; throws NcclError naming `context` and what could not be
// loaded (the library, or a function in it).
const NcclLibrary& nccl_library(const std::string& context);
// Null where the libraries cannot be loaded.
const NcclLibrary* nccl_library_if_present();

}  // namespace troupe::collectives::detail
