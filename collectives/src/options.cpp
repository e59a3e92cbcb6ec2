#include "troupe/collectives/options.hpp"

#include <cstdlib>
#include <string_view>

namespace troupe::collectives {

namespace {
bool truthy(std::string_view v) { return v == "1" || v == "true" || v == "on" || v == "ON" || v == "TRUE"; }

// Open MPI's btl list allows shared memory: unset, an exclusion list ("^tcp") that
// does not name vader/sm, or an inclusion list that does.
bool mpi_allows_shared_memory(std::string_view btl) {
  const bool names_shm = btl.find("vader") != std::string_view::npos || btl.find("sm") != std::string_view::npos;
  return btl.starts_with('^') ? !names_shm : names_shm;
}
}  // namespace

Options options_from_environment() {
  Options options;
  if (const char* value = std::getenv("TROUPE_DEBUG_COLLECTIVES")) options.debug = truthy(value);
  if (const char* value = std::getenv("TROUPE_CHECK_COLLECTIVES")) options.check_signatures = truthy(value);
  if (const char* btl = std::getenv("OMPI_MCA_btl")) options.shared_memory = mpi_allows_shared_memory(btl);
  if (const char* value = std::getenv("TROUPE_COLLECTIVES_SHM")) options.shared_memory = truthy(value);
  return options;
}

}  // namespace troupe::collectives
