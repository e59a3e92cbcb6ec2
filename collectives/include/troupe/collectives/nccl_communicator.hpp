// NcclCommunicator: the CUDA backend, over NCCL (ProcessGroupNCCL's role in c10d).
//
// Bootstrap: collective over an MPI communicator — rank 0 creates the ncclUniqueId and
// broadcasts it over MPI, then every rank joins with ncclCommInitRank on its device
// (by default the local rank modulo the visible devices, as torchrun assigns them).
//
// Streams: every collective runs on the communicator's own CUDA stream. It first waits
// for work already queued on the legacy default stream (where troupe's tensor ops run),
// so it sees finished inputs; Work::test() asks whether its completion event has
// fired; Work::wait() polls that event until done or the timeout passes (then it
// throws TimeoutError and fails the communicator), which also orders later host code
// after the result. A communicator destroyed while a collective still hangs is
// aborted (ncclCommAbort), so a hung collective cannot hold the GPU forever.
//
// Arithmetic: NCCL reduces f16 and bf16 in the type itself (not in f32 as the MPI
// backend does); the results can differ from the MPI backend's by an ulp per step.
// gather and scatter are grouped ncclSend/ncclRecv (NCCL has no such collectives).
// Buffers in CUDA memory on this communicator's device go over NCCL; a collective whose
// buffers are all host memory (a GradScaler's overflow verdict, a clip norm, state-dict
// metadata) goes over an MPI communicator duplicated from the bootstrap one, as
// PyTorch's default "cpu:gloo,cuda:nccl" process group sends CPU tensors over gloo.
// Both take their turn in this communicator's one sequence. Host and device buffers
// mixed in one call, or memory of another device, are refused before anything is queued.
//
// Signatures: every device call's signature is all-reduced over an MPI communicator of
// its own beside the kernels (Options::check_signatures, as on the MPI backend); a
// mismatch throws CollectiveMismatch on every rank and aborts the NCCL communicator.
//
// Built only when the CUDA toolkit and NCCL are found (TROUPE_HAVE_NCCL); otherwise
// the constructor throws, and available() says false.
#pragma once

#include <mpi.h>

#include <memory>
#include <string_view>

#include "troupe/collectives/communicator.hpp"
#include "troupe/collectives/mpi_communicator.hpp"

namespace troupe::collectives {

namespace detail {
struct NcclState;
}

class NcclCommunicator : public Communicator {
 public:
  // Collective over `bootstrap`'s ranks. `device` < 0 picks the local rank's device.
  explicit NcclCommunicator(MpiCommunicator& bootstrap, int device = -1, Options options = options_from_environment());
  ~NcclCommunicator() override;

  // Built with NCCL, and a CUDA device is visible.
  static bool available();

  std::string_view backend() const override { return "nccl"; }
  // ncclCommSplit: same device, ranks ordered by (key, old rank).
  std::unique_ptr<Communicator> split(int color, int key) override;
  int device() const;

 protected:
  Work start(const Collective& collective, bool blocking) override;

 private:
  NcclCommunicator(std::shared_ptr<detail::NcclState> state, std::unique_ptr<Communicator> host, MPI_Comm check_comm,
                   int rank, int size, Options options);
  std::shared_ptr<Operation> signed_operation(const Collective& c);
  std::shared_ptr<detail::NcclState> state_;
  std::unique_ptr<Communicator> host_;   // MPI, for collectives on host buffers
  MPI_Comm check_comm_ = MPI_COMM_NULL;  // the device calls' signature exchanges
};

}  // namespace troupe::collectives
