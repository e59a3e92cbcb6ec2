// StagedCommunicator: collectives on CUDA buffers over a host backend (MPI), each CUDA
// buffer copied to host memory before the call and its result copied back after, as
// PyTorch's gloo backend takes CUDA tensors.
//
// For what NCCL cannot do: NCCL refuses two ranks of one communicator on one device,
// so two ranks sharing a GPU (a laptop, a one-GPU test machine) need this; so does a
// machine with CUDA but without NCCL. It is slower than NCCL by two copies a call and
// the host's network, and every call finishes on the host (Work::wait_on_device cannot
// hand the wait to the GPU), so use NCCL where every rank has a device of its own.
//
// Host buffers go to the host backend as they are. A CUDA buffer is copied out on the
// calling thread (which waits for the kernels that write it, as any copy to the host
// does) and back by whoever drives the call to completion; until then the device copy
// is not written. Arithmetic is the host backend's (f16 and bf16 summed in f32 by MPI).
#pragma once

#include <memory>
#include <string_view>

#include "troupe/collectives/communicator.hpp"

namespace troupe::collectives {

class StagedCommunicator : public Communicator {
 public:
  // Over `host`'s ranks, with its rank, size and options. `host` carries every call, each
  // numbered in its own sequence, so nothing else may call it any more.
  explicit StagedCommunicator(std::unique_ptr<Communicator> host);
  ~StagedCommunicator() override;

  std::string_view backend() const override { return "staged"; }
  // The host backend's, e.g. "mpi".
  std::string_view host_backend() const { return host_->backend(); }
  std::unique_ptr<Communicator> split(int color, int key) override;

 protected:
  Work start(const Collective& collective, bool blocking) override;

 private:
  std::unique_ptr<Communicator> host_;
};

}  // namespace troupe::collectives
