// A POSIX shared-memory segment that the ranks of one node map: collectives' shared
// memory channel keeps one per rank, actors' doorbells one per node. Each rank makes
// or opens its mapping on its own, then all_agree (agree.hpp) decides whether every
// rank may use it; the name is unlinked as soon as every rank has mapped it, so that
// nothing is left in /dev/shm whatever happens next.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::mpi {

// A name that no other job, runtime or communicator on the node uses: `prefix`, then
// rank 0's pid, its clock and a count of the names it made. Collective over `comm`.
std::string unique_segment_name(MPI_Comm comm, std::string_view prefix);

// The segment `name` mapped read-write, `bytes` long; `create` makes it (zero-filled)
// and fails if it exists. Null on any failure: the caller falls back to another path.
std::byte* map_shared_segment(const std::string& name, std::size_t bytes, bool create);

// Removes the name; mappings stay valid until unmapped.
void unlink_shared_segment(const std::string& name);

// Unmaps what map_shared_segment returned (null: nothing).
void unmap_shared_segment(std::byte* base, std::size_t bytes);

}  // namespace troupe::mpi
