// Small helpers every distributed training loop needs: who am I (global rank, local
// rank on this host, primary or not), and metrics agreed across ranks.
//
// Local rank comes from Open MPI's environment (OMPI_COMM_WORLD_LOCAL_RANK, set by
// mpirun for each process), the way torchrun's LOCAL_RANK is used: to pick the GPU of
// this process on a multi-GPU host. Outside mpirun (a singleton process) it is 0.
#pragma once

#include <vector>

#include "troupe/collectives/communicator.hpp"

namespace troupe::train {

// Rank among the processes on this host (OMPI_COMM_WORLD_LOCAL_RANK), 0 without mpirun.
int local_rank();
// Processes on this host (OMPI_COMM_WORLD_LOCAL_SIZE), 1 without mpirun.
int local_size();
// Rank in the whole job (OMPI_COMM_WORLD_RANK), 0 without mpirun.
int global_rank();

// Rank 0 of `comm`: the one that prints, logs and writes files.
inline bool is_primary(const collectives::Communicator& comm) { return comm.rank() == 0; }

// The CUDA device this process should use: local_rank() modulo the devices visible,
// or -1 when there are none (CPU training).
int device_for_local_rank(int visible_devices);

// The mean of `value` over the ranks of `comm` (collective; every rank gets it).
double reduce_mean(collectives::Communicator& comm, double value);
// The sum of `value` over the ranks (collective).
double reduce_sum(collectives::Communicator& comm, double value);
// Every rank's `value`, in rank order, on every rank (collective).
std::vector<double> gather(collectives::Communicator& comm, double value);
// Every rank's `values` (same length on every rank), concatenated in rank order.
std::vector<double> gather(collectives::Communicator& comm, const std::vector<double>& values);

}  // namespace troupe::train
