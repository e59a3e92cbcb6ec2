// What actors_bench's two parts share: the row each figure becomes, medians, a barrier
// that does not spin, and the JSON bench/run reads.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "troupe/json_string.hpp"

namespace troupe::actors {
class Runtime;
}

namespace actors_bench {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string name, unit, better;
  double ours, theirs;
  std::string baseline, target;
  int met;  // -1: no target
};

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Waits for every rank without spinning a core (MPI_Barrier busy-polls).
inline void quiet_barrier(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    // 1 ms, not less: rank 1's main thread waits here while rank 0 times its asks,
    // and every wake-up takes a core from one of the two threads being timed.
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

inline void write_json(const std::string& path, const std::vector<Row>& rows) {
  using troupe::json_string;
  std::ofstream out(path);
  out << "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    char numbers[256];
    std::snprintf(numbers, sizeof numbers, "\"troupe\": %.3f, \"baseline_value\": %s, \"ratio\": %s", r.ours,
                  r.theirs > 0 ? std::to_string(r.theirs).c_str() : "null",
                  r.theirs > 0 ? std::to_string(r.ours / r.theirs).c_str() : "null");
    out << "  {\"case\": " << json_string(r.name) << ", \"unit\": " << json_string(r.unit)
        << ", \"better\": " << json_string(r.better) << ", " << numbers << ", \"baseline\": " << json_string(r.baseline)
        << ", \"target\": " << json_string(r.target) << ", \"met\": "
        << (r.met < 0 ? "null"
            : r.met   ? "true"
                      : "false")
        << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  out << "]\n";
}

// --objects (actors_objects.cpp), on 3 ranks: returns the exit status.
int objects_bench(troupe::actors::Runtime& rt, bool quick, const std::string& json);

}  // namespace actors_bench
