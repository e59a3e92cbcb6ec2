// Route: one way a collective of an MpiCommunicator travels between its ranks.
//
// MpiCommunicator keeps one object per route, in a fixed order, and runs a call on the
// first that supports it (choose_route, mpi_communicator.cpp; the table in
// docs/COLLECTIVES.md). Each route is one type with three parts:
//   supports  whether it carries a call. Decided only from what every rank of a
//             matching call knows alike -- the call's signature, whether it blocks, the
//             communicator's options and shape -- so every rank takes the same route:
//             MPI never matches a blocking collective with a non-blocking one, nor a
//             ring's messages with MPI's own collective.
//   run       carries it. A route that finishes on the calling thread returns null (the
//             communicator first finishes all async work in flight, as MPI orders
//             collectives by posting); the others return an Operation, which the
//             engine (engine.hpp) starts now and advances until it is done.
//   verify    how its ranks prove they issued the same call (signature_check.hpp), used
//             by run. Its shape is the route's own -- a wait before any peer's data is
//             read, a header merged in every message, a check started beside a blocking
//             MPI call, a wrapper around an operation -- so it is not a virtual.
//
// Each route's header tells its algorithm once, in prose, beside its code.
#pragma once

#include <mpi.h>

#include <memory>
#include <string_view>

#include "mpi_request_operation.hpp"
#include "troupe/collectives/collective.hpp"
#include "troupe/collectives/operation.hpp"
#include "troupe/collectives/options.hpp"

namespace troupe::collectives::detail {

class BlockingWatchdog;
class ShmChannel;
struct StartOrder;

// What routes share of their MpiCommunicator; it outlives them.
struct RouteSite {
  MpiSite mpi;                          // collectives on mpi.comm, user send/recv on mpi.p2p
  MPI_Comm check_comm = MPI_COMM_NULL;  // signature exchanges and packed calls
  int tag_limit = 32767;                // MPI_TAG_UB
  const Options* options = nullptr;
  ShmChannel* shm = nullptr;                // null unless shared memory is on and every rank on this node
  BlockingWatchdog* watchdog = nullptr;     // null without a timeout
  std::shared_ptr<StartOrder> start_order;  // of MPI's collectives that wait for their check
};

class Route {
 public:
  explicit Route(const RouteSite& site) : site_(site) {}
  virtual ~Route() = default;
  Route(const Route&) = delete;
  Route& operator=(const Route&) = delete;

  // For errors and tests: "board", "packed", "mpi-blocking", "shm", "ring", "mpi".
  virtual std::string_view name() const = 0;
  virtual bool supports(const Collective& collective, bool blocking) const = 0;
  // Whether run finishes the call on the calling thread (and returns null).
  virtual bool on_caller() const = 0;
  virtual std::shared_ptr<Operation> run(const Collective& collective) = 0;

 protected:
  const RouteSite& site() const { return site_; }
  const Options& options() const { return *site_.options; }
  // A small blocking call, which the routes that finish on the calling thread share:
  // a blocking collective (not send/recv, not in debug mode, whose allgather must come
  // first) of at most Options::direct_blocking_bytes (the larger buffer).
  bool small_blocking(const Collective& collective, bool blocking) const;

 private:
  const RouteSite& site_;
};

// A route whose call the engine advances (shm, ring, mpi): run returns an operation,
// which verify wraps with its signature check (with_signature_check: on the board on
// one node, else exchanged on the check communicator) unless the check is off or the
// call is point to point. With `agree_first` the operation starts only once the
// signatures agree, in issue order; otherwise at once, the check running beside it.
class EngineRoute : public Route {
 public:
  EngineRoute(const RouteSite& site, bool agree_first) : Route(site), agree_first_(agree_first) {}
  bool on_caller() const final { return false; }

 protected:
  std::shared_ptr<Operation> verify(std::shared_ptr<Operation> operation, const Collective& collective) const;

 private:
  const bool agree_first_;
};

}  // namespace troupe::collectives::detail
