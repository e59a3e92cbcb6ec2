// A small blocking collective that one rank never joins: it runs as a direct MPI call
// (Options::direct_blocking_bytes), so no exception can end it; the watchdog must
// name it and abort the job within the timeout. CTest matches the message and
// mpirun's non-zero exit (WILL_FAIL is not needed: the pass regex decides).
// With the argument "mismatch", rank 1 issues another collective instead, and the
// watchdog must name both calls from the signature board, long before the timeout.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/mpi/environment.hpp"

int main(int argc, char** argv) {
  troupe::mpi::Environment env(&argc, &argv);
  const bool mismatch = argc > 1 && std::string(argv[1]) == "mismatch";
  troupe::collectives::Options options;
  options.timeout = mismatch ? std::chrono::milliseconds(60000) : std::chrono::milliseconds(300);
  options.shm_board_bytes = 0;  // the calls go to MPI, not on the board (board_route.hpp)
  troupe::collectives::MpiCommunicator comm(MPI_COMM_WORLD, options);
  float value = 1.0f;
  comm.allreduce(troupe::collectives::Buffer(&value, 1));  // #0: everyone comes
  if (mismatch) {
    std::vector<float> all(static_cast<std::size_t>(comm.size()));
    try {
      if (comm.rank() == 0)
        comm.barrier();  // #1
      else
        comm.allgather(troupe::collectives::Buffer(&value, 1), troupe::collectives::Buffer(all));  // #1
    } catch (const std::exception& e) {  // MPI let the calls through: the check after them names it
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
      return 1;
    }
    std::puts("the mismatched calls returned without an error");
    return 0;
  }
  if (comm.rank() == 0) {
    comm.barrier();  // #1: rank 1 never comes
    std::puts("barrier returned although rank 1 never joined");
    return 0;
  }
  std::this_thread::sleep_for(std::chrono::seconds(20));  // the abort ends this first
  return 0;
}
