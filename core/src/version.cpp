#include "troupe/version.hpp"

namespace troupe {

const char* version() noexcept { return TROUPE_VERSION_STRING; }

}  // namespace troupe
