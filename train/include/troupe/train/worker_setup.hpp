// What a TrainWorker sets up before its model: its device and its communicator.
#pragma once

#include <memory>

#include "troupe/collectives/communicator.hpp"
#include "troupe/tensor/device.hpp"
#include "troupe/train/worker_options.hpp"

namespace troupe::train {

// CPU, or this rank's GPU (its local rank modulo the GPUs it sees, as torchrun assigns
// them), made the calling thread's current device. A bad name or an unusable GPU is
// an InvalidArgument.
tensor::Device worker_device(const WorkerOptions& options);

// The world, over MPI (CPU tensors) or NCCL (CUDA tensors; MPI carries its id), or for
// CUDA tensors with backend "mpi" over MPI through host copies, with
// collective_timeout_s as every collective's bound.
std::unique_ptr<collectives::Communicator> worker_communicator(const WorkerOptions& options, tensor::Device device);

}  // namespace troupe::train
