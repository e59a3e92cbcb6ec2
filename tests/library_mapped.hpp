// Whether a shared library whose path contains `name` is mapped into this process
// (/proc/self/maps): the tests of CUDA on demand ask it before and after a GPU is.
#pragma once

#include <fstream>
#include <string>

namespace troupe::testing {

inline bool library_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace troupe::testing
