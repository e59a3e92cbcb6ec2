// Round-trip latency of an actor ask across ranks, next to a raw MPI ping-pong of
// the same payload, printed as a table.
//
//   mpirun -np 2 build/examples/ping_pong [--iterations N] [--threads N] [--json]
//
// --threads is RuntimeOptions::threads: 1 (the default) runs actor methods on a pool
// thread, 0 on the progress thread that received the call.
//
// Rank 0 asks an Echo actor on rank 1 to return its argument; the baseline is
// MPI_Send/MPI_Recv between the same two processes on a communicator of its own.
// Each figure is the median of per-round-trip times.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/bytes.hpp"
#include "troupe/actors/runtime.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Payloads are troupe::Bytes, so they travel as attachments: sent from the caller's
// buffer, received into a pooled one.
struct Echo {
  troupe::Bytes echo(troupe::Bytes payload) { return payload; }
  static constexpr auto troupe_methods = troupe::methods<&Echo::echo>;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Waits for every rank without spinning a core (MPI_Barrier busy-polls).
void quiet_barrier(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  for (int done = 0; !done;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Median round trip of MPI_Send/MPI_Recv with `bytes` bytes, in microseconds.
double raw_round_trip(MPI_Comm comm, int rank, std::size_t bytes, int iterations) {
  std::vector<char> buffer(bytes, 1);
  std::vector<double> times;
  const int count = static_cast<int>(bytes);
  for (int i = 0; i < iterations + 5; ++i) {
    const auto start = Clock::now();
    if (rank == 0) {
      MPI_Send(buffer.data(), count, MPI_BYTE, 1, 0, comm);
      MPI_Recv(buffer.data(), count, MPI_BYTE, 1, 0, comm, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buffer.data(), count, MPI_BYTE, 0, 0, comm, MPI_STATUS_IGNORE);
      MPI_Send(buffer.data(), count, MPI_BYTE, 0, 0, comm);
    }
    if (i >= 5) times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return median(times);
}

double ask_round_trip(const troupe::ActorRef<Echo>& echo, std::size_t bytes, int iterations) {
  const troupe::Bytes payload(std::vector<std::byte>(bytes, std::byte{1}));
  std::vector<double> times;
  for (int i = 0; i < iterations + 5; ++i) {
    const auto start = Clock::now();
    const auto back = echo.ask(&Echo::echo, payload).get();
    if (i >= 5) times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (back.size() != bytes) throw troupe::Error("echo returned " + std::to_string(back.size()) + " bytes");
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 1000;
  troupe::RuntimeOptions options;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--iterations" && i + 1 < argc)
      iterations = std::stoi(argv[++i]);
    else if (flag == "--threads" && i + 1 < argc)
      options.threads = std::stoi(argv[++i]);
    else if (flag == "--json")
      json = true;
    else {
      std::fprintf(stderr, "usage: ping_pong [--iterations N] [--threads N] [--json]\n");
      return 2;
    }
  }
  troupe::Runtime rt(argc, argv, options);
  if (rt.size() < 2) {
    if (rt.rank() == 0) std::fprintf(stderr, "ping_pong: run it on 2 ranks (mpirun -np 2)\n");
    return 2;
  }
  MPI_Comm raw;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  const std::vector<std::size_t> sizes = {8, 1024, 64 * 1024, 1 << 20, 16 << 20};
  troupe::ActorRef<Echo> echo;
  if (rt.rank() == 0) echo = rt.spawn<Echo>(1);
  if (rt.rank() == 0 && !json) std::printf("%10s %14s %14s %8s\n", "bytes", "ask (us)", "raw MPI (us)", "ratio");
  for (std::size_t bytes : sizes) {
    const int n = bytes >= (1 << 20) ? std::max(10, iterations / 50) : iterations;
    double raw_us = 0, ask_us = 0;
    if (rt.rank() <= 1) raw_us = raw_round_trip(raw, rt.rank(), bytes, n);
    quiet_barrier(raw);
    if (rt.rank() == 0) ask_us = ask_round_trip(echo, bytes, n);
    quiet_barrier(raw);
    if (rt.rank() != 0) continue;
    if (json)
      std::printf("{\"bytes\": %zu, \"ask_us\": %.3f, \"raw_us\": %.3f}\n", bytes, ask_us, raw_us);
    else
      std::printf("%10zu %14.2f %14.2f %8.2f\n", bytes, ask_us, raw_us, ask_us / raw_us);
  }
  MPI_Comm_free(&raw);
  return 0;
}
