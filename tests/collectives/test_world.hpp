// What every collectives test file shares: the world communicator and MPI rank/size,
// test data made of small integers (so that sums, products and maxima are exact in
// every dtype and a reference can be computed on every rank), and a comparison that
// reports the first differing element with both values.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "troupe/collectives/buffer.hpp"
#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/collectives/reduce_op.hpp"

namespace troupe::collectives::testing {

// A communicator over MPI_COMM_WORLD (the MPI backend even with one rank), made on
// first use and destroyed by release_world() before MPI is finalised.
MpiCommunicator& world();
// The same over MPI alone (Options::shared_memory off), so that MPI's own paths stay
// tested on a world that fits on one node, where world() takes shared memory.
MpiCommunicator& mpi_world();
// Shared memory with slots of a few elements, so that small buffers take many rounds
// and reuse every slot.
MpiCommunicator& tiny_slot_world();
// MPI alone with the ring forced at every size in segments of a few elements, so
// that small buffers take the ring's multi-segment paths (allreduce, reduce_scatter,
// allgather).
MpiCommunicator& ring_world();
void release_world();
// Every rank of MPI_COMM_WORLD is on this node, so that communicators over it have the
// shared-memory channel and its signature board (unless their options turn it off).
bool world_on_one_node();
// Options for tests: a timeout that fails a stuck test in seconds, not minutes.
Options test_options();

// A typed host buffer of `count` elements.
struct Data {
  DType dtype = DType::f32;
  std::size_t count = 0;
  std::vector<std::byte> bytes;

  Data(DType dtype, std::size_t count);
  Buffer buffer() { return Buffer(bytes.data(), count, dtype); }
  double get(std::size_t i) const;
  void set(std::size_t i, double value);
};

enum class Pattern { mixed, factors };

// Element i of rank r's input: small integers in [-5, 5] (u8: [0, 10]) for `mixed`,
// factors in {-1, 1, 2} (u8: {1, 2}) for `factors`, so that products stay tiny.
double value(Pattern pattern, DType dtype, int rank, std::size_t i);
Pattern pattern_for(ReduceOp op);
// Rank `rank`'s input of `count` elements starting at element `first`.
Data input_of(Pattern pattern, DType dtype, int rank, std::size_t count, std::size_t first = 0);
// op folded over ranks 0..size-1 of value(..., i), as a double.
double reduced(ReduceOp op, Pattern pattern, DType dtype, int size, std::size_t i);
// Tolerance for comparing a result of `op` on `dtype`: 0 where the result is exact.
double tolerance(ReduceOp op, DType dtype);

// Empty string when every element of `got` is within `tol` (relative above 1) of
// want(i); otherwise a message naming the first bad index and both values.
template <class Want>
std::string compare(const Data& got, Want&& want, double tol = 0.0) {
  for (std::size_t i = 0; i < got.count; ++i) {
    const double w = want(i), g = got.get(i);
    const double allowed = tol * (std::abs(w) > 1 ? std::abs(w) : 1.0);
    if (!(std::abs(g - w) <= allowed)) {
      return "element " + std::to_string(i) + " of " + std::to_string(got.count) + " is " + std::to_string(g) +
             ", want " + std::to_string(w);
    }
  }
  return {};
}

// The sizes the issue asks every collective to be checked at: empty, one, odd, not a
// multiple of the world size, and larger than a ring segment.
inline const std::vector<std::size_t> kSizes{0, 1, 7, 1023, (std::size_t{1} << 20) + 3};
inline const std::vector<std::size_t> kSmallSizes{0, 1, 7, 1023};

std::string dtype_label(DType dtype);

}  // namespace troupe::collectives::testing
