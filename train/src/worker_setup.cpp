#include "troupe/train/worker_setup.hpp"

#include <chrono>
#include <cstdint>

#include "troupe/collectives/mpi_communicator.hpp"
#include "troupe/collectives/nccl_communicator.hpp"
#include "troupe/collectives/staged_communicator.hpp"
#include "troupe/error.hpp"
#include "troupe/tensor/device.hpp"
#include "troupe/train/distributed.hpp"

namespace troupe::train {

WorkerDevice parse_worker_device(std::string_view name) {
  if (name == "cpu") return WorkerDevice::cpu;
  if (name == "cuda") return WorkerDevice::cuda;
  TROUPE_THROW(InvalidArgument, "unknown device '", std::string(name), "' (cpu or cuda)");
}

Precision parse_precision(std::string_view name) {
  if (name == "f32") return Precision::f32;
  if (name == "bf16") return Precision::bf16;
  TROUPE_THROW(InvalidArgument, "unknown precision '", std::string(name), "' (f32 or bf16)");
}

const char* worker_device_name(WorkerDevice device) { return device == WorkerDevice::cuda ? "cuda" : "cpu"; }

const char* precision_name(Precision precision) { return precision == Precision::bf16 ? "bf16" : "f32"; }

tensor::Device worker_device(const WorkerOptions& options) {
  if (options.device == WorkerDevice::cpu) return tensor::Device::cpu();
  tensor::check_device_usable(tensor::Device::cuda(), "TrainWorker");
  const tensor::Device device = tensor::Device::cuda(device_for_local_rank(tensor::cuda_device_count()));
  tensor::cuda_set_device(device);  // the constructor's own thread, before the model moves
  return device;
}

std::unique_ptr<collectives::Communicator> worker_communicator(const WorkerOptions& options, tensor::Device device) {
  TROUPE_CHECK(options.collective_timeout_s > 0, "TrainWorker: collective_timeout_s must be > 0, got ",
               options.collective_timeout_s);
  collectives::Options comm_options = collectives::options_from_environment();
  comm_options.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(options.collective_timeout_s * 1000));
  if (device.is_cpu()) {
    TROUPE_CHECK(options.backend.empty() || options.backend == "mpi", "TrainWorker: backend '", options.backend,
                 "' on the CPU, whose collectives are MPI's; nccl needs device cuda");
    return collectives::world_communicator(comm_options);
  }
  if (options.backend == "mpi")
    return std::make_unique<collectives::StagedCommunicator>(collectives::world_communicator(comm_options));
  TROUPE_CHECK(options.backend.empty() || options.backend == "nccl", "TrainWorker: unknown backend '", options.backend,
               "' (nccl or mpi)");
  collectives::MpiCommunicator bootstrap(MPI_COMM_WORLD, comm_options);
  return std::make_unique<collectives::NcclCommunicator>(bootstrap, device.index, comm_options);
}

}  // namespace troupe::train
