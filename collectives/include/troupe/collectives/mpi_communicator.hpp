// MpiCommunicator: the CPU backend, over MPI (ProcessGroupMPI's role in c10d).
//
// It works on its own duplicates of the parent communicator — one for collectives,
// one for user send/recv, one for debug-mode checks — so its traffic can never match
// a message of the actors' control communicator or of another Communicator.
//
// Collectives are MPI's non-blocking ones (MPI_Iallreduce, MPI_Ibcast, ...), posted on
// the caller's thread and completed by polling MPI_Test (work.hpp), except:
// allreduce, reduce, reduce_scatter, allgather and broadcast when all ranks share a node,
// which go through shared memory (shm_collective.hpp, Options::shared_memory); large
// allreduces across nodes, which run the pipelined ring (allreduce_ring.hpp) over
// point-to-point; and small blocking calls, which call MPI's blocking function
// directly under a watchdog (Options::direct_blocking_bytes).
// f16/bf16 reduce through user-defined MPI ops that combine in f32 (reduce_op.hpp).
// Buffers must be host memory; a CUDA buffer is refused before anything is sent.
//
// Needs MPI initialised with MPI_THREAD_MULTIPLE (troupe::mpi::Environment): the
// progress thread and callers call MPI concurrently.
#pragma once

#include <mpi.h>

#include <memory>
#include <string_view>

#include "troupe/collectives/communicator.hpp"

namespace troupe::collectives {

namespace detail {
class BlockingWatchdog;
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

 protected:
  Work start(const Collective& collective, bool blocking) override;

 private:
  struct Adopt {};
  // Takes ownership of `comm` (the result of a split).
  MpiCommunicator(MPI_Comm comm, Options options, Adopt);
  void set_up();
  void check_host(const Collective& collective, const Buffer& buffer, const char* which) const;

  // Runs `collective` as one blocking MPI call if the fast path applies.
  bool try_direct(const Collective& collective, bool blocking);
  // The operation that runs `collective` (shared memory, the ring or an MPI request),
  // wrapped with its signature check unless that is off.
  std::shared_ptr<Operation> signed_operation(const Collective& collective);
  std::shared_ptr<Operation> operation_for(const Collective& collective);

  MPI_Comm comm_ = MPI_COMM_NULL;                       // collectives and the ring's messages
  MPI_Comm p2p_comm_ = MPI_COMM_NULL;                   // user send/recv, so user tags cannot meet ring tags
  MPI_Comm check_comm_ = MPI_COMM_NULL;                 // signature exchanges (signature_check.hpp)
  int tag_limit_ = 32767;                               // MPI_TAG_UB
  std::unique_ptr<detail::BlockingWatchdog> watchdog_;  // null without a timeout
  std::shared_ptr<detail::StartOrder> start_order_;     // of MPI's collectives that wait for their check
  std::unique_ptr<detail::ShmChannel> shm_;             // null unless Options::shared_memory and one node
};

}  // namespace troupe::collectives
