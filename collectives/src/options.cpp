#include "troupe/collectives/options.hpp"

#include <cstdlib>
#include <string_view>

namespace troupe::collectives {

Options options_from_environment() {
  Options options;
  if (const char* value = std::getenv("TROUPE_DEBUG_COLLECTIVES")) {
    const std::string_view v(value);
    options.debug = v == "1" || v == "true" || v == "on" || v == "ON" || v == "TRUE";
  }
  return options;
}

}  // namespace troupe::collectives
