// Doorbells: how a rank wakes the idle progress thread of another rank on its node at
// once, rather than when that thread's backoff ends (up to 1 ms later, transport.hpp).
//
// MPI cannot wake a thread that sleeps: a receiver polls, so an idle progress thread
// sleeps between polls and a message that arrives meanwhile waits for the next one.
// The ranks of a node share a page of futex words, one per rank (POSIX shared memory,
// named by the node's first rank and unlinked once every rank has mapped it). A
// progress thread about to sleep marks its word, checks once more for a message, and
// waits on the word for its backoff; a sender that finds the word marked bumps it and
// wakes the futex. Ranks on other nodes are not rung: they are found at the next poll.
// A bell is rung once a sleep: later senders, until a thread arms it again, find it
// rung and leave it, since every thread woken receives all that was posted before.
//
// The order (a fence on each side: the sleeper marks then probes, the sender posts
// then reads the mark) makes a message either seen by the probe or rung for; a lost
// wake-up can only cost what the backoff costs without doorbells, since every wait is
// bounded by it. Without shared memory every call is a no-op and wait() returns false
// at once: the transport then sleeps on its condition variable as before.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::actors::detail {

class Doorbells {
 public:
  // Collective over `comm` (every rank of the runtime).
  explicit Doorbells(MPI_Comm comm);
  ~Doorbells();
  Doorbells(const Doorbells&) = delete;
  Doorbells& operator=(const Doorbells&) = delete;

  bool enabled() const { return self_ != nullptr; }
  // Wakes `rank`'s progress thread if it sleeps (rank: in `comm`; one on another node,
  // or this one, without effect unless `rank` is this rank). True if a thread slept.
  bool ring(int rank);
  // Sleeps up to `period` unless `ready()` holds once this rank's bell is armed;
  // true when rung (or woken by ring() of this rank).
  bool wait(std::chrono::nanoseconds period, const std::function<bool()>& ready);

 private:
  struct alignas(64) Bell {
    std::atomic<std::uint32_t> rings{0};
    std::atomic<std::uint32_t> asleep{0};  // threads of the rank waiting on it
    std::atomic<std::uint32_t> rung{0};    // rung since a thread last armed it
  };
  Bell* bells_ = nullptr;       // the node's, mapped
  std::size_t bytes_ = 0;       // of the mapping
  Bell* self_ = nullptr;        // this rank's
  std::vector<Bell*> of_rank_;  // by rank in comm; null for ranks on other nodes
};

}  // namespace troupe::actors::detail
