// CUDA on demand: collectives on host buffers never map libcudart or libnccl; the
// first question about NCCL does (where the build has it). Exits non-zero, naming the
// library, when either half is wrong.
#include <cstdio>

#include "../library_mapped.hpp"
#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/collectives/nccl_communicator.hpp"
#include "troupe/mpi/environment.hpp"

using troupe::testing::library_mapped;

int main(int argc, char** argv) {
  troupe::mpi::Environment env(&argc, &argv);
  troupe::collectives::MpiCommunicator comm(MPI_COMM_WORLD);
  float value = 1.0f;
  comm.allreduce(troupe::collectives::Buffer(&value, 1));
  for (const char* library : {"libcudart", "libnccl", "libcublas", "libtroupe_tensor_cuda"}) {
    if (library_mapped(library)) {
      std::fprintf(stderr, "FAIL: %s is mapped after collectives on host buffers\n", library);
      return 1;
    }
  }
#if defined(TROUPE_HAVE_NCCL)
  troupe::collectives::NcclCommunicator::available();
  if (!library_mapped("libnccl")) {
    std::fprintf(stderr, "FAIL: NcclCommunicator::available() did not load libnccl\n");
    return 1;
  }
#endif
  std::printf("ok: no CUDA library until NCCL was asked for\n");
  return 0;
}
