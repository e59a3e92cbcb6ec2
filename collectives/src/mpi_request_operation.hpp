// MpiRequestOperation: a collective that is one MPI non-blocking call (MPI_Iallreduce,
// MPI_Ibcast, ..., MPI_Isend). start() posts it, progress() is MPI_Test, and an
// optional finishing step runs once it completes (avg's division, moving an in-place
// reduce_scatter result to the rank's own block, checking a received length).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>

#include "troupe/collectives/operation.hpp"

namespace troupe::collectives::detail {

class MpiRequestOperation : public Operation {
 public:
  using Post = std::function<void(MPI_Request*)>;
  using Finish = std::function<void(const MPI_Status&)>;

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
std::shared_ptr<Operation> make_mpi_operation(const Collective& collective, MPI_Comm comm, MPI_Comm p2p_comm,
                                              int rank, int size);

}  // namespace troupe::collectives::detail
