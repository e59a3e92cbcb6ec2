// Run by kill_rank_test.sh under mpirun with 3 ranks: rank 2 hosts an actor and is
// killed with SIGKILL while ranks 0 and 1 wait on it. Each survivor prints how long
// its caller waited before the error came; the script checks the figures and that
// the job then ended with a message naming rank 2.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "troupe/actors/runtime.hpp"

namespace {
struct Sleeper {
  int nap(int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return ms;
  }
  static constexpr auto troupe_methods = troupe::methods<&Sleeper::nap>;
};
constexpr int kVictim = 2;
constexpr auto kKillAfter = std::chrono::milliseconds(300);

// A task that never ends on the victim and answers at once elsewhere: a retry after
// the loss must run it on a survivor.
int g_rank = -1;
int survive(int victim) {
  if (g_rank == victim) std::this_thread::sleep_for(std::chrono::seconds(60));
  return g_rank;
}
}  // namespace

int main(int argc, char** argv) {
  troupe::Runtime rt(argc, argv);
  if (rt.size() != 3) {
    std::fprintf(stderr, "kill_rank_test: needs exactly 3 ranks\n");
    return 2;
  }
  g_rank = rt.rank();
  troupe::ActorGroup<Sleeper> sleepers = rt.spawn_on_each<Sleeper>();
  troupe::Future<int> retried;
  if (rt.rank() == 0) retried = rt.submit<&survive>(troupe::TaskOptions{.rank = kVictim, .retries = 1}, kVictim);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rt.rank() == kVictim) {
    std::this_thread::sleep_for(kKillAfter);
    kill(getpid(), SIGKILL);
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    sleepers[kVictim].ask(&Sleeper::nap, 60000).get();
    std::printf("rank %d: the call returned, which it should not have\n", rt.rank());
  } catch (const troupe::RemoteError& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::printf("rank %d: caller got %s after %lld ms: %s\n", rt.rank(),
                e.code() == troupe::actors::ErrorCode::rank_lost ? "rank_lost" : "another error",
                static_cast<long long>(waited.count()), e.what());
  }
  if (rt.rank() == 0) {
    try {
      std::printf("rank 0: the task was retried on rank %d\n", retried.get(std::chrono::seconds(5)));
    } catch (const std::exception& e) {
      std::printf("rank 0: the task was not retried: %s\n", e.what());
    }
  }
  std::fflush(stdout);
  return 0;  // the Runtime's shutdown sees the lost rank and ends the job, naming it
}
