#include "shm_channel.hpp"

#include <algorithm>
#include <string>

#include "troupe/error.hpp"
#include "troupe/mpi/agree.hpp"
#include "troupe/mpi/mpi_error.hpp"
#include "troupe/mpi/shared_segment.hpp"

namespace troupe::collectives::detail {

namespace {
bool on_one_node(MPI_Comm comm, int size) {
  MPI_Comm node = MPI_COMM_NULL;
  TROUPE_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int node_size = 0;
  TROUPE_MPI_CHECK(MPI_Comm_size(node, &node_size));
  TROUPE_MPI_CHECK(MPI_Comm_free(&node));
  return node_size == size;
}

}  // namespace

std::unique_ptr<ShmChannel> ShmChannel::create(MPI_Comm comm, std::size_t slot_bytes, int slots) {
  int rank = 0, size = 0;
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  TROUPE_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size < 2 || slots < 1) return nullptr;
  // reduce_scatter puts at least one element of each rank's block in a slot.
  slot_bytes = std::max(slot_bytes, static_cast<std::size_t>(size) * sizeof(std::int64_t));
  if (!mpi::all_agree(comm, on_one_node(comm, size))) return nullptr;

  // A segment per rank, named by the channel and the rank.
  const std::string base = mpi::unique_segment_name(comm, "/troupe-");
  const auto name = [&](int q) { return troupe::detail::concat(base, "-", q); };

  std::unique_ptr<ShmChannel> channel(new ShmChannel());
  channel->rank_ = rank;
  channel->size_ = size;
  channel->slots_ = slots;
  channel->slot_bytes_ = slot_bytes;
  channel->segment_bytes_ = kHeaderBytes + static_cast<std::size_t>(slots) * slot_bytes;
  channel->bases_.assign(static_cast<std::size_t>(size), nullptr);
  auto& bases = channel->bases_;

  bases[static_cast<std::size_t>(rank)] = mpi::map_shared_segment(name(rank), channel->segment_bytes_, true);
  const bool created = bases[static_cast<std::size_t>(rank)] != nullptr;
  bool mapped = created;
  if (mpi::all_agree(comm, created)) {
    for (int q = 0; q < size; ++q) {
      if (q != rank)
        mapped =
            (bases[static_cast<std::size_t>(q)] = mpi::map_shared_segment(name(q), channel->segment_bytes_, false)) &&
            mapped;
    }
  } else {
    mapped = false;
  }
  // Every rank has mapped every segment (or given up): the names can go, so that
  // nothing is left behind in /dev/shm whatever happens next.
  const bool all_mapped = mpi::all_agree(comm, mapped);
  if (created) mpi::unlink_shared_segment(name(rank));
  if (!all_mapped) return nullptr;
  return channel;
}

ShmChannel::~ShmChannel() {
  for (std::byte* base : bases_) mpi::unmap_shared_segment(base, segment_bytes_);
}

bool ShmChannel::all_reached(Stage stage, std::uint64_t rounds, int* laggard) const {
  for (int q = 0; q < size_; ++q) {
    if (load(q, stage) < rounds) {
      if (laggard) *laggard = q;
      return false;
    }
  }
  return true;
}

}  // namespace troupe::collectives::detail
