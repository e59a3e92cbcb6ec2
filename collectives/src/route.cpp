#include "route.hpp"

#include <algorithm>

#include "signature_check.hpp"

namespace troupe::collectives::detail {

bool Route::small_blocking(const Collective& c, bool blocking) const {
  // The larger buffer's size as every rank knows it: gather's output and scatter's input
  // exist on the root only, and a size read from them would send the root one way and
  // its peers the other (MPI_Igather against MPI_Gather: a hang).
  const std::size_t per_rank = c.count * element_size(c.dtype);
  const bool spans_ranks = c.kind == CollectiveKind::allgather || c.kind == CollectiveKind::gather ||
                           c.kind == CollectiveKind::reduce_scatter || c.kind == CollectiveKind::scatter;
  const std::size_t larger = spans_ranks ? per_rank * static_cast<std::size_t>(site_.mpi.size) : per_rank;
  return blocking && !options().debug && !c.is_point_to_point() && larger <= options().direct_blocking_bytes;
}

std::shared_ptr<Operation> EngineRoute::verify(std::shared_ptr<Operation> operation, const Collective& c) const {
  if (!options().check_signatures || c.is_point_to_point()) return operation;
  const RouteSite& s = site();
  return with_signature_check(std::move(operation), s.shm, s.check_comm, s.mpi.rank, s.mpi.size, options().timeout,
                              agree_first_ ? s.start_order : nullptr);
}

}  // namespace troupe::collectives::detail
