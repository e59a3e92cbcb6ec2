// Fuzz target: TROUPE_FAULT's text. parse_fault either returns a plan or throws
// InvalidArgument quoting the text; nothing else.
#include <cstdint>
#include <string_view>

#include "troupe/error.hpp"
#include "troupe/supervisor/fault.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    troupe::supervisor::parse_fault(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const troupe::InvalidArgument&) {
  }
  return 0;
}
