// MpiRequestOperation: a collective that is one MPI non-blocking call (MPI_Iallreduce,
// MPI_Ibcast, ..., MPI_Isend). start() posts it, progress() is MPI_Test, and an
// optional finishing step runs once it completes (avg's division, moving an in-place
// reduce_scatter result to the rank's own block, checking a received length).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

#include "troupe/collectives/operation.hpp"

namespace troupe::collectives::detail {

// One MPI call and what follows it. `post` starts it: non-blocking into the request
// it is given, or, given null, as the blocking MPI function (the fast path of small
// blocking collectives); `finish` runs once it has completed.
struct MpiCall {
  std::function<void(MPI_Request*)> post;
  std::function<void(const MPI_Status&)> finish;
  std::string peer;  // who a point-to-point call waits for, for timeout messages
};

class MpiRequestOperation : public Operation {
 public:
  using Post = decltype(MpiCall::post);
  using Finish = decltype(MpiCall::finish);

  MpiRequestOperation(Collective collective, Post post, Finish finish = {}, std::string peer = {})
      : Operation(std::move(collective)), post_(std::move(post)), finish_(std::move(finish)), peer_(std::move(peer)) {}

  void start() override;
  bool progress() override;
  std::string waiting_on() const override { return peer_; }

 private:
  Post post_;
  Finish finish_;
  std::string peer_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// The operation that runs `collective` on `comm` (or, for send/recv, on `p2p_comm`).
MpiCall make_mpi_call(const Collective& collective, MPI_Comm comm, MPI_Comm p2p_comm, int rank, int size);
std::shared_ptr<Operation> make_mpi_operation(const Collective& collective, MPI_Comm comm, MPI_Comm p2p_comm,
                                              int rank, int size);
// Runs a collective (not send/recv) as MPI's blocking call on the calling thread.
void run_mpi_blocking(const Collective& collective, MPI_Comm comm, int rank, int size);

}  // namespace troupe::collectives::detail
