// The control plane at scale, run across the virtual cluster's nodes at 16, 32 and 64
// ranks (tests/cluster/cluster_test.py control_plane): the runtime starts, rank 0 asks
// an actor on every rank, then the job idles for two seconds while each rank counts
// the liveness messages it sends and the CPU it uses. Rank 0 prints one line of
// figures and fails the run when the job's liveness traffic is not O(N): with
// all-to-all heartbeats it would be N(N-1) per period, on the ring it is N.
#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "troupe/actors/runtime.hpp"

namespace {

struct Echo {
  int rank = 0;
  explicit Echo(int r) : rank(r) {}
  int whoami() { return rank; }
  static constexpr auto troupe_methods = troupe::methods<&Echo::whoami>;
};

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  const auto started = std::chrono::steady_clock::now();
  // Up to 64 ranks share 2 cores here, about 21 a core: a rank can wait over a second
  // for a core while MPI starts, which the default 1 s timeout calls lost. What this
  // program measures (traffic, CPU, startup) does not depend on the timeout.
  troupe::RuntimeOptions options;
  options.liveness_timeout = std::chrono::seconds(5);
  troupe::Runtime rt(argc, argv, options);
  const double startup = since(started);
  auto echoes = rt.spawn_on_each<Echo>(rt.rank());
  double ask_all = 0;
  int wrong = 0;
  if (rt.rank() == 0) {
    const auto asked = std::chrono::steady_clock::now();
    auto answers = troupe::when_all(echoes.ask(&Echo::whoami)).get();
    ask_all = since(asked);
    for (int r = 0; r < rt.size(); ++r) wrong += answers[static_cast<std::size_t>(r)] != r;
  }
  MPI_Barrier(MPI_COMM_WORLD);

  constexpr double kIdle = 2.0;
  const auto sent_before = rt.liveness_messages_sent();
  const double cpu_before = cpu_seconds();
  const auto liveness_before = rt.liveness_cpu_time();
  const auto idle_from = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(kIdle));
  const double idle = since(idle_from);
  const double liveness = std::chrono::duration<double>(rt.liveness_cpu_time() - liveness_before).count() / idle;
  const double mine[3] = {static_cast<double>(rt.liveness_messages_sent() - sent_before) / idle,
                          (cpu_seconds() - cpu_before) / idle, liveness};
  double total[3] = {0, 0, 0}, worst[4] = {0, 0, 0, 0};
  const double worst_mine[4] = {mine[0], mine[1], startup, liveness};
  MPI_Reduce(mine, total, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(worst_mine, worst, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  int status = 0;
  if (rt.rank() == 0) {
    const int n = rt.size();
    const double per_period = 1.0 / 0.1;  // RuntimeOptions::heartbeat_period, 100 ms
    std::printf(
        "control plane: %d ranks, startup %.2f s (slowest rank), ask every rank %.1f ms, "
        "liveness %.0f messages/s in all (ring: %.0f, all-to-all would be %.0f), "
        "CPU per rank idle %.2f%% of a core (highest %.2f%%), of which liveness %.3f%% (highest %.3f%%)\n",
        n, worst[2], ask_all * 1000, total[0], n * per_period, n * (n - 1) * per_period, 100 * total[1] / n,
        100 * worst[1], 100 * total[2] / n, 100 * worst[3]);
    if (wrong) {
      std::printf("control plane: FAILED: %d rank(s) answered with another rank's number\n", wrong);
      status = 1;
    }
    if (total[0] > 1.5 * n * per_period) {
      std::printf("control plane: FAILED: %.0f liveness messages/s is not O(N) (limit %.0f)\n", total[0],
                  1.5 * n * per_period);
      status = 1;
    }
  }
  std::fflush(stdout);
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}
