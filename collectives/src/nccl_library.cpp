#include "nccl_library.hpp"

#include <dlfcn.h>

#include "troupe/collectives/collective_error.hpp"

namespace troupe::collectives::detail {
namespace {

// By soname first (LD_LIBRARY_PATH and the loader's cache, as a link would find it),
// then the file the build was configured with. Both names come from CMake.
void* open_library(const char* soname, const char* built_with, std::string& why) {
  if (void* h = dlopen(soname, RTLD_NOW | RTLD_GLOBAL)) return h;
  std::string first = dlerror();
  if (void* h = dlopen(built_with, RTLD_NOW | RTLD_GLOBAL)) return h;
  why = "cannot load " + std::string(soname) + " (" + first + ") or " + built_with + " (" + dlerror() + ")";
  return nullptr;
}

template <typename F>
bool fetch(void* library, const char* name, F& out, std::string& why) {
  out = reinterpret_cast<F>(dlsym(library, name));
  if (out == nullptr) why = std::string(name) + " is missing from the loaded CUDA or NCCL library";
  return out != nullptr;
}

struct Loaded {
  NcclLibrary library{};
  bool ok = false;
  std::string why;
};

Loaded load() {
  Loaded l;
  void* cudart = open_library(TROUPE_CUDART_SONAME, TROUPE_CUDART_PATH, l.why);
  void* nccl = cudart ? open_library(TROUPE_NCCL_SONAME, TROUPE_NCCL_PATH, l.why) : nullptr;
  if (nccl == nullptr) return l;
  NcclLibrary& lib = l.library;
  std::string& why = l.why;
  bool ok = true;
  ok = ok && fetch(cudart, "cudaEventCreateWithFlags", lib.cudaEventCreateWithFlags, why);
  ok = ok && fetch(cudart, "cudaEventDestroy", lib.cudaEventDestroy, why);
  ok = ok && fetch(cudart, "cudaEventQuery", lib.cudaEventQuery, why);
  ok = ok && fetch(cudart, "cudaEventRecord", lib.cudaEventRecord, why);
  ok = ok && fetch(cudart, "cudaFreeAsync", lib.cudaFreeAsync, why);
  ok = ok && fetch(cudart, "cudaGetDeviceCount", lib.cudaGetDeviceCount, why);
  ok = ok && fetch(cudart, "cudaGetErrorString", lib.cudaGetErrorString, why);
  ok = ok && fetch(cudart, "cudaMallocAsync", lib.cudaMallocAsync, why);
  ok = ok && fetch(cudart, "cudaSetDevice", lib.cudaSetDevice, why);
  ok = ok && fetch(cudart, "cudaStreamCreateWithFlags", lib.cudaStreamCreateWithFlags, why);
  ok = ok && fetch(cudart, "cudaStreamDestroy", lib.cudaStreamDestroy, why);
  ok = ok && fetch(cudart, "cudaStreamWaitEvent", lib.cudaStreamWaitEvent, why);
  ok = ok && fetch(nccl, "ncclAllGather", lib.ncclAllGather, why);
  ok = ok && fetch(nccl, "ncclAllReduce", lib.ncclAllReduce, why);
  ok = ok && fetch(nccl, "ncclBroadcast", lib.ncclBroadcast, why);
  ok = ok && fetch(nccl, "ncclCommAbort", lib.ncclCommAbort, why);
  ok = ok && fetch(nccl, "ncclCommCount", lib.ncclCommCount, why);
  ok = ok && fetch(nccl, "ncclCommDestroy", lib.ncclCommDestroy, why);
  ok = ok && fetch(nccl, "ncclCommGetAsyncError", lib.ncclCommGetAsyncError, why);
  ok = ok && fetch(nccl, "ncclCommInitRank", lib.ncclCommInitRank, why);
  ok = ok && fetch(nccl, "ncclCommSplit", lib.ncclCommSplit, why);
  ok = ok && fetch(nccl, "ncclCommUserRank", lib.ncclCommUserRank, why);
  ok = ok && fetch(nccl, "ncclGetErrorString", lib.ncclGetErrorString, why);
  ok = ok && fetch(nccl, "ncclGetUniqueId", lib.ncclGetUniqueId, why);
  ok = ok && fetch(nccl, "ncclGroupEnd", lib.ncclGroupEnd, why);
  ok = ok && fetch(nccl, "ncclGroupStart", lib.ncclGroupStart, why);
  ok = ok && fetch(nccl, "ncclRecv", lib.ncclRecv, why);
  ok = ok && fetch(nccl, "ncclReduce", lib.ncclReduce, why);
  ok = ok && fetch(nccl, "ncclReduceScatter", lib.ncclReduceScatter, why);
  ok = ok && fetch(nccl, "ncclSend", lib.ncclSend, why);
  l.ok = ok;
  return l;
}

const Loaded& loaded() {
  static const Loaded once = load();
  return once;
}

}  // namespace

const NcclLibrary& nccl_library(const std::string& context) {
  const Loaded& l = loaded();
  if (!l.ok) TROUPE_THROW(NcclError, context, ": ", l.why);
  return l.library;
}

const NcclLibrary* nccl_library_if_present() {
  const Loaded& l = loaded();
  return l.ok ? &l.library : nullptr;
}

}  // namespace troupe::collectives::detail
