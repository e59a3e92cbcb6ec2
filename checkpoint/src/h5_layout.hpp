// The HDF5 settings that make a file a troupe checkpoint (docs/CHECKPOINT_FORMAT.md),
// in one place for the two writers: FileWriter (one process, the sec2 driver) and
// ParallelWriter (every rank, MPI-IO). Both build their property lists, dataspaces and
// groups here, so the files they write cannot drift apart.
#pragma once

#include <hdf5.h>

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
