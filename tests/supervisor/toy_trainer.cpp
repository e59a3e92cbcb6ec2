// toy_trainer: a stand-in for a training program, to test troupe-run before the real
// training and checkpoint modules are wired to it.
//
//   toy_trainer --steps N [--save-every K] [--step-ms M] [--no-client-rank R]
//
// Each step "computes" for M ms, then all-reduces one int64 per rank through a real
// Communicator and folds the sum into a state value (value = (value * 31 + sum) mod
// 1000003), so the final value depends on every step having been done exactly once,
// in order. Every K steps rank 0 saves (step, value) to TROUPE_CHECKPOINT_DIR/toy-step.txt
// (temporary name, then rename: a crash never leaves half a file), and a launch
// resumes from it. It reports progress to troupe-run and honours TROUPE_FAULT.
// Rank 0 writes the final value to toy-result.txt and prints it.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "troupe/collectives/communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/mpi/environment.hpp"
#include "troupe/supervisor/client.hpp"
#include "troupe/supervisor/fault.hpp"

namespace sv = troupe::supervisor;
namespace coll = troupe::collectives;

namespace {

struct Args {
  std::int64_t steps = 20;
  std::int64_t save_every = 5;
  int step_ms = 10;
  int no_client_rank = -1;  // this rank does not register (tests the registration timeout)
  int save_ms = 0;          // every save takes this long, on every rank, in the checkpoint_save phase
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    TROUPE_CHECK(i + 1 < argc, "toy_trainer: ", flag, " needs a value");
    long value = std::stol(argv[++i]);
    if (flag == "--steps")
      args.steps = value;
    else if (flag == "--save-every")
      args.save_every = value;
    else if (flag == "--step-ms")
      args.step_ms = static_cast<int>(value);
    else if (flag == "--no-client-rank")
      args.no_client_rank = static_cast<int>(value);
    else if (flag == "--save-ms")
      args.save_ms = static_cast<int>(value);
    else
      TROUPE_CHECK(false, "toy_trainer: unknown flag ", flag);
  }
  TROUPE_CHECK(args.steps >= 0 && args.save_every > 0 && args.step_ms >= 0, "toy_trainer: bad arguments");
  return args;
}

void save(const std::string& dir, std::int64_t step, std::int64_t value) {
  std::string path = dir + "/toy-step.txt";
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << step << " " << value << "\n";
    TROUPE_CHECK(out.good(), "toy_trainer: cannot write ", path, ".tmp");
  }
  TROUPE_CHECK(std::rename((path + ".tmp").c_str(), path.c_str()) == 0, "toy_trainer: cannot rename to ", path);
}

void train(const troupe::mpi::Environment& mpi, const Args& args, const sv::RunEnvironment& run,
           sv::SupervisorClient* client) {
  const int rank = mpi.rank();
  const auto fault = sv::FaultInjector::from_environment(rank);
  auto comm = coll::world_communicator();
  // A dump (troupe-run's hang verdict) lists its last collectives, while it lives.
  struct Recorder {
    sv::SupervisorClient* client;
    ~Recorder() {
      if (client) client->set_flight_recorder(nullptr);
    }
  } recorder{client};
  if (client) client->set_flight_recorder([c = comm.get()] { return c->flight_record(); });

  std::int64_t state[2] = {0, 1};  // (next step, value)
  if (rank == 0 && !run.checkpoint_dir.empty()) {
    std::ifstream in(run.checkpoint_dir + "/toy-step.txt");
    if (in && !(in >> state[0] >> state[1]))
      TROUPE_THROW(troupe::FormatError, "toy_trainer: ", run.checkpoint_dir, "/toy-step.txt is not 'step value'");
  }
  comm->broadcast(coll::Buffer(state, 2), 0);
  if (rank == 0) std::cout << "toy_trainer: restart " << run.restart << ", starting at step " << state[0] << std::endl;

  for (std::int64_t step = state[0]; step < args.steps; ++step) {
    if (client) client->report_step(static_cast<std::uint64_t>(step));
    if (rank == 0 && step == state[0]) {
      // For the restart benchmark: the moment the (re)launched job does real work.
      double t = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::printf("toy_trainer: first step %lld at t=%.6f\n", static_cast<long long>(step), t);
      std::fflush(stdout);
    }
    fault.at_step(static_cast<std::uint64_t>(step));
    std::this_thread::sleep_for(std::chrono::milliseconds(args.step_ms));
    std::int64_t contribution = state[1] + rank + step;
    if (client) client->report_collective(comm->next_sequence());
    comm->allreduce(coll::Buffer(&contribution, 1));
    state[1] = (state[1] * 31 + contribution) % 1000003;
    if (!run.checkpoint_dir.empty() && (step + 1) % args.save_every == 0) {
      sv::PhaseScope saving(client, sv::Phase::checkpoint_save);
      std::this_thread::sleep_for(std::chrono::milliseconds(args.save_ms));  // a slow file system
      if (rank == 0) save(run.checkpoint_dir, step + 1, state[1]);
    }
  }
  comm->barrier();
  if (rank == 0) {
    std::cout << "toy_trainer: finished " << args.steps << " steps, value " << state[1] << std::endl;
    if (!run.checkpoint_dir.empty()) std::ofstream(run.checkpoint_dir + "/toy-result.txt") << state[1] << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  troupe::mpi::Environment mpi(&argc, &argv);
  std::unique_ptr<sv::SupervisorClient> client;
  try {
    const Args args = parse(argc, argv);
    const sv::RunEnvironment run = sv::run_environment();
    // Created after MPI and before the first step; its destructor says goodbye.
    if (mpi.rank() != args.no_client_rank)
      client = sv::SupervisorClient::connect_if_supervised(run, mpi.rank(), mpi.size());
    train(mpi, args, run, client.get());
    return 0;
  } catch (const std::exception& e) {
    // Drop the connection without goodbye, naming the error: troupe-run stops the job at
    // once (the other ranks are stuck in a collective) and quotes it. mpirun's copy of
    // this stderr can be cut off when the job is stopped.
    std::cerr << "toy_trainer: rank " << mpi.rank() << ": " << e.what() << std::endl;
    if (client) client->abandon(e.what());
    return 1;
  }
}
