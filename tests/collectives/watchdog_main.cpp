// A small blocking collective that one rank never joins: it runs as a direct MPI call
// (Options::direct_blocking_bytes), so no exception can end it; the watchdog must
// name it and abort the job within the timeout. CTest matches the message and
// mpirun's non-zero exit (WILL_FAIL is not needed: the pass regex decides).
#include <chrono>
#include <cstdio>
#include <thread>

#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/mpi/environment.hpp"

int main(int argc, char** argv) {
  troupe::mpi::Environment env(&argc, &argv);
  troupe::collectives::Options options;
  options.timeout = std::chrono::milliseconds(300);
  troupe::collectives::MpiCommunicator comm(MPI_COMM_WORLD, options);
  float value = 1.0f;
  comm.allreduce(troupe::collectives::Buffer(&value, 1));  // #0: everyone comes
  if (comm.rank() == 0) {
    comm.barrier();  // #1: rank 1 never comes
    std::puts("barrier returned although rank 1 never joined");
    return 0;
  }
  std::this_thread::sleep_for(std::chrono::seconds(20));  // the abort ends this first
  return 0;
}
