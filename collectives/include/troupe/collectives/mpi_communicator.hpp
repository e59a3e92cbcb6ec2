// MpiCommunicator: the CPU backend, over MPI (ProcessGroupMPI's role in c10d).
//
// It works on its own duplicates of the parent communicator — one for collectives,
// one for user send/recv, one for debug-mode checks — so its traffic can never match
// a message of the actors' control communicator or of another Communicator.
//
// Each call takes one of six routes, the first of these that carries it (route.hpp and
// the table in docs/COLLECTIVES.md): small blocking calls on the signature board (one
// node), packed with their signature (across nodes) or as MPI's blocking function;
// then shared memory's rounds (one node), the pipelined ring (large reductions across
// nodes) and, for the rest, MPI's non-blocking call, advanced by polling.
// f16/bf16 reduce through user-defined MPI ops that combine in f32 (reduce_op.hpp).
// Buffers must be host memory; a CUDA buffer is refused before anything is sent.
//
// Needs MPI initialised with MPI_THREAD_MULTIPLE (troupe::mpi::Environment): the
// progress thread and callers call MPI concurrently.
#pragma once

#include <mpi.h>

#include <memory>
#include <string_view>
#include <vector>

#include "troupe/collectives/communicator.hpp"

namespace troupe::collectives {

namespace detail {
class BlockingWatchdog;
class Route;
struct RouteSite;
class ShmChannel;
struct StartOrder;
}  // namespace detail

class MpiCommunicator : public Communicator {
 public:
  // Duplicates `parent`; collective over it.
  explicit MpiCommunicator(MPI_Comm parent = MPI_COMM_WORLD, Options options = options_from_environment());
  ~MpiCommunicator() override;

  std::string_view backend() const override { return "mpi"; }
  // Agrees on (color, key) through an allgather first, so a rank that never arrives
  // is a TimeoutError rather than a hang inside MPI_Comm_split.
  std::unique_ptr<Communicator> split(int color, int key) override;

  // Whether allreduce, reduce, reduce_scatter, allgather and broadcast go through shared
  // memory (Options::shared_memory, and every rank on this node).
  bool shared_memory() const { return shm_ != nullptr; }

  // The communicator collectives run on (to bootstrap NCCL, or for a test's barrier).
  MPI_Comm comm() const { return comm_; }

  // The route that would carry `collective` ("board", "packed", "mpi-blocking", "shm",
  // "ring" or "mpi"), for tests and diagnostics.
  std::string_view route_name(const Collective& collective, bool blocking) const;

 protected:
  Work start(const Collective& collective, bool blocking) override;

 private:
  struct Adopt {};
  // Takes ownership of `comm` (the result of a split).
  MpiCommunicator(MPI_Comm comm, Options options, Adopt);
  void set_up();
  void check_host(const Collective& collective, const Buffer& buffer, const char* which) const;

  // The first of routes_ that supports the call: the one place a route is chosen.
  detail::Route& choose_route(const Collective& collective, bool blocking) const;

  MPI_Comm comm_ = MPI_COMM_NULL;                       // collectives and the ring's messages
  MPI_Comm p2p_comm_ = MPI_COMM_NULL;                   // user send/recv, so user tags cannot meet ring tags
  MPI_Comm check_comm_ = MPI_COMM_NULL;                 // signature exchanges (signature_check.hpp)
  int tag_limit_ = 32767;                               // MPI_TAG_UB
  std::unique_ptr<detail::BlockingWatchdog> watchdog_;  // null without a timeout
  std::shared_ptr<detail::StartOrder> start_order_;     // of MPI's collectives that wait for their check
  std::unique_ptr<detail::ShmChannel> shm_;             // null unless Options::shared_memory and one node
  std::unique_ptr<detail::RouteSite> route_site_;       // what the routes share of the above
  std::vector<std::unique_ptr<detail::Route>> routes_;  // in the order they are asked
};

}  // namespace troupe::collectives
