#include "route.hpp"

#include <algorithm>

#include "signature_check.hpp"

namespace troupe::collectives::detail {

bool Route::small_blocking(const Collective& c, bool blocking) const {
  return blocking && !options().debug && !c.is_point_to_point() &&
         std::max(c.input.nbytes(), c.output.nbytes()) <= options().direct_blocking_bytes;
}

std::shared_ptr<Operation> EngineRoute::verify(std::shared_ptr<Operation> operation, const Collective& c) const {
  if (!options().check_signatures || c.is_point_to_point()) return operation;
  const RouteSite& s = site();
  return with_signature_check(std::move(operation), s.shm, s.check_comm, s.mpi.rank, s.mpi.size, options().timeout,
                              agree_first_ ? s.start_order : nullptr);
}

}  // namespace troupe::collectives::detail
