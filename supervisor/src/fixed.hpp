// A number as troupe-run's reports print it: fixed, with `digits` after the point.
#pragma once

#include <cstdio>
#include <string>

namespace troupe::supervisor {

inline std::string fixed(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

}  // namespace troupe::supervisor
