// MpiRequestOperation: a collective that is one MPI non-blocking call (MPI_Iallreduce,
// MPI_Ibcast, ..., MPI_Isend). start() posts it, progress() is MPI_Test, and a
// finishing step runs once it completes (avg's division, moving an in-place
// reduce_scatter result to the rank's own block, checking a received length).
//
// The call is chosen by a switch on the collective's kind each time it is posted
// rather than captured in a std::function: the blocking fast path of small
// collectives costs a few hundred nanoseconds in all, and a heap allocation per call
// was a third of troupe's overhead over calling MPI directly.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "troupe/collectives/operation.hpp"

namespace troupe::collectives::detail {

// Where a collective runs: collectives on `comm`, send/recv on `p2p`.
struct MpiSite {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm p2p = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
};

class MpiRequestOperation : public Operation {
 public:
  MpiRequestOperation(Collective collective, MpiSite site) : Operation(std::move(collective)), site_(site) {}

  void start() override;
  bool progress() override;
  std::string waiting_on() const override;

 private:
  MpiSite site_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// Posts `collective` as MPI's non-blocking call into *request or, given null, runs
// MPI's blocking call (not for send/recv) on the calling thread.
void post_mpi(const Collective& collective, const MpiSite& site, MPI_Request* request);
// What follows the MPI call's completion.
void finish_mpi(const Collective& collective, const MpiSite& site, const MPI_Status& status);
// Runs a collective (not send/recv) as MPI's blocking call on the calling thread.
void run_mpi_blocking(const Collective& collective, const MpiSite& site);

}  // namespace troupe::collectives::detail
