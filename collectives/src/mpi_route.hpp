// The two routes through MPI's own collectives, for what troupe's own routes do not
// carry.
//
// MpiBlockingRoute: a small blocking call (Route::small_blocking) that neither the
// board nor a packed message carries -- across nodes a reduce, gather or scatter, or
// any call over 4 KB; on one node one that exceeds the board -- runs as MPI's blocking
// function: Open MPI's non-blocking collectives cost 2-3x more at small sizes. Nothing
// interrupts MPI once inside, so the blocking watchdog (blocking_watchdog.hpp) keeps
// its timeout. Its proof runs beside the call rather than before it (every small call
// would otherwise wait for the slowest rank twice): on one node the signature is
// published on the board first and the peers' entries read after; across nodes a
// non-blocking all-reduce of the signatures starts first and completes during the
// call (MPI matches it with the same exchange of a call that took another route). A
// call that fails inside MPI (calls of different sizes can) asks the proof first, so
// the error names the mismatch if that is what it was.
//
// MpiRoute: everything else -- asynchronous calls and large blocking ones across nodes
// that the ring does not take (allgather, gather, scatter, broadcast, small counts),
// send and recv -- is one MPI non-blocking call (mpi_request_operation.hpp) advanced by
// the engine. Its proof comes first: Open MPI's non-blocking collectives given calls of
// different sizes abort the job through MPI_COMM_WORLD's error handler, so the call is
// posted only once the signatures agree, in issue order (StartOrder).
#pragma once

#include "route.hpp"

namespace troupe::collectives::detail {

class MpiBlockingRoute : public Route {
 public:
  using Route::Route;
  std::string_view name() const override { return "mpi-blocking"; }
  bool supports(const Collective& collective, bool blocking) const override {
    return small_blocking(collective, blocking);
  }
  bool on_caller() const override { return true; }
  std::shared_ptr<Operation> run(const Collective& collective) override;

 private:
  class Check;  // the proof beside the call (mpi_route.cpp)
};

class MpiRoute : public EngineRoute {
 public:
  explicit MpiRoute(const RouteSite& site) : EngineRoute(site, /*agree_first=*/true) {}
  std::string_view name() const override { return "mpi"; }
  bool supports(const Collective&, bool) const override { return true; }
  std::shared_ptr<Operation> run(const Collective& collective) override;
};

}  // namespace troupe::collectives::detail
