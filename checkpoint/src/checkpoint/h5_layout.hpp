// The HDF5 settings that make a file a troupe checkpoint (docs/CHECKPOINT_FORMAT.md),
// in one place for the two writers: FileWriter (one process, the sec2 driver) and
// ParallelWriter (every rank, MPI-IO). Both build their property lists, dataspaces and
// groups here, so the files they write cannot drift apart. The reader checks a dataset
// against the same layout here too, before it trusts any size the file declares.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "h5_call.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::checkpoint::detail {

// On a file-access list the caller made (the parallel writer adds its MPI-IO driver).
void set_checkpoint_file_access(hid_t fapl);
// Link and attribute creation order tracked and indexed, so tensors list as written.
Handle checkpoint_file_create_plist();
Handle checkpoint_group_create_plist();
// Contiguous, never filled (every byte is written right after), attribute order tracked.
Handle checkpoint_dataset_create_plist();
// The dataspace of a tensor: scalar for 0-dim, simple otherwise. `where` is for errors.
Handle dataspace_of(const tensor::Shape& shape, const std::string& where);

// A dataset's extent as far as a reader may trust it: rank at most kMaxRank, every
// dimension, the element count and the byte count (at `item_size` bytes an element)
// computed without overflow and within int64. A null dataspace is refused. Throws
// FormatError naming `where` (file:dataset) and the numbers.
inline constexpr int kMaxRank = 32;  // HDF5's own bound (H5S_MAX_RANK)
struct Extent {
  tensor::Shape shape;
  std::size_t item_size = 0;
  std::uint64_t count = 0;  // elements
  std::uint64_t bytes = 0;  // count * item_size
};
Extent checked_extent(hid_t dataset, std::size_t item_size, const std::string& where);
// Checks that `dataset` keeps exactly its `extent.bytes` inside this file of `file_size`
// bytes: contiguous or compact storage of that size (a contiguous run ending within the
// file), or chunks, unfiltered or through deflate/shuffle/fletcher32 only, that can
// decompress to that size. External storage, virtual datasets and other filters (which
// would open other files or load plugins) are refused. Metadata only: reads no data.
void check_storage(hid_t dataset, const Extent& extent, std::uint64_t file_size, const std::string& where);

// Groups and datasets are named by absolute paths without empty parts: "/model/0.weight".
// Throws InvalidArgument naming `file` otherwise.
void check_path(std::string_view path, const std::string& file);
std::string parent_of(std::string_view path);  // "/model/a" -> "/model", "/model" -> "/"

// Creates groups on demand (parents first) and remembers which exist.
class GroupMaker {
 public:
  explicit GroupMaker(std::string file_path) : file_path_(std::move(file_path)) {}
  void ensure(hid_t file, hid_t group_plist, std::string_view group);

 private:
  std::string file_path_;
  std::set<std::string, std::less<>> known_{"/"};
};

}  // namespace troupe::checkpoint::detail
