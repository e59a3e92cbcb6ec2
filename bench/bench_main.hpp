// What every bench program does alike: time in process CPU time, take the lower
// median (bench/run's statistics.median_low), and end with bench/run's exit codes.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include "troupe/error.hpp"

namespace troupe::bench {

// Seconds of CPU time used by this process, all threads: another process on a shared
// machine is not charged to the program, a helper thread of its own is.
inline double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

inline double lower_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

// Runs a program's body: a bad flag (InvalidArgument) exits 2 with its message, any
// other error 1 as "program: error: ...".
template <class Body>
int run_main(const char* program, Body&& body) {
  try {
    return body();
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace troupe::bench
