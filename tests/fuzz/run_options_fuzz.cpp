// Fuzz target: troupe-run's command line, the input split into arguments at NUL
// bytes. parse_run_options either returns options or throws InvalidArgument naming
// the bad flag or value; nothing else.
#include <cstdint>
#include <string>
#include <vector>

#include "run_options.hpp"
#include "troupe/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0)
      args.emplace_back();
    else
      args.back().push_back(static_cast<char>(data[i]));
  }
  try {
    troupe::supervisor::parse_run_options(args);
  } catch (const troupe::InvalidArgument&) {
  }
  return 0;
}
