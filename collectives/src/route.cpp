#include "route.hpp"

#include <algorithm>

#include "signature_check.hpp"

namespace troupe::collectives::detail {

bool Route::small_blocking(const Collective& c, bool blocking) const {
  return blocking && !options().debug && !c.is_point_to_point() &&
         std::max(c.input.nbytes(), c.output.nbytes()) <= options().direct_blocking_bytes;
}

std::shared_ptr<Operation> Route::checked(std::shared_ptr<Operation> operation, const Collective& c,
                                          bool agree_first) const {
  if (!options().check_signatures || c.is_point_to_point()) return operation;
  return with_signature_check(std::move(operation), site_.shm, site_.check_comm, site_.mpi.rank, site_.mpi.size,
                              options().timeout, agree_first ? site_.start_order : nullptr);
}

}  // namespace troupe::collectives::detail
