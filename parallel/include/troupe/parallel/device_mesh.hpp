// DeviceMesh: the job's ranks as a grid with named dimensions ("pp", "dp", "tp", or
// FSDP's "replicate" and "shard"), with one communicator per dimension, built once per
// job and handed to each parallelism -- torch.distributed's DeviceMesh in role.
//
//   auto world = collectives::world_communicator();
//   parallel::DeviceMesh mesh(*world, parallel::parse_mesh("dp=-1,tp=2"));  // dp: the rest
//   auto& tp = mesh.comm("tp");          // the ranks that differ only in their tp coordinate
//   int stage = mesh.coordinate("pp");   // (a dimension it lacks is an InvalidArgument)
//
// Layout: row-major over the dimensions in the order given, the last varying fastest, so
// rank r's coordinate in dimension d is (r / stride_d) % size_d. Put the dimension whose
// collectives are most frequent (tp) last: its groups are then consecutive ranks, which
// mpirun places on one node first.
//
// The communicator of dimension d joins the ranks whose coordinates agree in every other
// dimension, ordered by their coordinate in d. Each is a split() of the world's (MPI's
// or NCCL's), so it has the world's backend, options and checks. Construction is a
// collective over `world`: every rank passes the same dimensions, and a rank that does
// not is an InvalidArgument on every rank, before any split.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/collectives/communicator.hpp"

namespace troupe::parallel {

struct MeshDim {
  std::string name;
  int size = 1;  // -1: whatever the world's size leaves (at most one dimension)
};

// "pp=2,dp=-1,tp=2" (names of letters, digits and '_'; sizes >= 1, or -1 once);
// anything else is an InvalidArgument quoting it.
std::vector<MeshDim> parse_mesh(std::string_view text);

class DeviceMesh {
 public:
  // Collective over `world`, which must outlive the mesh.
  DeviceMesh(collectives::Communicator& world, std::vector<MeshDim> dims);
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;
  ~DeviceMesh();

  // The dimensions, outer first, with -1 resolved.
  const std::vector<MeshDim>& dims() const { return dims_; }
  bool has(std::string_view dim) const;
  int size(std::string_view dim) const;
  // This rank's coordinate in `dim`, and its communicator.
  int coordinate(std::string_view dim) const;
  collectives::Communicator& comm(std::string_view dim) const;
  // The world rank at `coordinates` (one per dimension, in order).
  int rank_at(const std::vector<int>& coordinates) const;
  collectives::Communicator& world() const { return world_; }
  // "pp 2 x dp 2 x tp 2", for messages and logs.
  std::string describe() const;

 private:
  std::size_t index_of(std::string_view dim) const;  // InvalidArgument naming the dimensions

  collectives::Communicator& world_;
  std::vector<MeshDim> dims_;
  std::vector<int> strides_;
  std::vector<int> coordinates_;
  std::vector<std::unique_ptr<collectives::Communicator>> comms_;
};

}  // namespace troupe::parallel
