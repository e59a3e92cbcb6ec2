// The actors test binary runs under mpirun with 1, 2 or 4 ranks. One Runtime lives
// for the whole binary (main), and every test runs on every rank; rank 0 usually
// drives while the others serve. Each test ends with a barrier so no rank starts
// the next test while another still asks actors from the previous one.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cereal/types/map.hpp>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/runtime.hpp"

namespace troupe::test {

// The binary's runtime (set by main).
Runtime& runtime();
// RuntimeOptions::threads of this run (the binary's --threads).
int pool_threads();

inline int last_rank() { return runtime().size() - 1; }

// A rank hears messages while a method runs only if a pool thread receives meanwhile:
// with no pool threads the one receiving thread is the one running the method, so a
// cancel, a kill, a deadline's arrival or a call of another concurrency group is seen
// only after it.
inline bool receives_while_busy() { return pool_threads() > 0 || runtime().size() == 1; }

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Ends a test on every rank together. MPI_Barrier would spin at full speed and take
// a core from the ranks still working; this waits with short sleeps instead.
inline void barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

struct Nested {
  std::string label;
  std::vector<std::map<std::string, std::vector<int>>> tables;
  double weight = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(label, tables, weight);
  }
  bool operator==(const Nested&) const = default;
};

struct Counter {
  explicit Counter(int start = 0) : value(start) {}
  int add(int x) { return value += x; }
  void reset() { value = 0; }
  int get() const { return value; }
  std::string echo(std::string s) { return s; }
  std::map<std::string, int> count(std::vector<std::string> words) {
    std::map<std::string, int> out;
    for (auto& w : words) ++out[w];
    return out;
  }
  Nested nested(Nested n) {
    n.weight *= 2;
    return n;
  }
  std::vector<char> bytes(std::vector<char> b) { return b; }
  int fail(std::string message) { throw std::invalid_argument(message); }
  int slow(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  }
  int value;
  static constexpr auto troupe_methods =
      troupe::methods<&Counter::add, &Counter::reset, &Counter::get, &Counter::echo, &Counter::count, &Counter::nested,
                      &Counter::bytes, &Counter::fail, &Counter::slow>;
};

}  // namespace troupe::test
