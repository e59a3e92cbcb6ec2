// FileReader's state, shared by its three files: file_reader.cpp (opening, reading),
// file_structure.cpp (links, groups, datasets: what a hostile file may put there is
// refused before HDF5 follows or allocates anything) and file_verify.cpp (checksums).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "h5_call.hpp"
#include "h5_types.hpp"
#include "troupe/checkpoint/file_reader.hpp"
#include "troupe/checkpoint/printable.hpp"

namespace troupe::checkpoint {

namespace detail {

// One hard link of a group: the name, what it leads to and where that object's header is.
struct Link {
  std::string name;
  H5O_type_t type;
  haddr_t addr;
};

struct LinkList {
  hid_t lapl;
  std::vector<Link> links;
  std::string refused;  // the first link refused, if any, and why
  std::string why;
};

// A group or dataset met walking the file, by full path.
struct Object {
  std::string path;
  H5O_type_t type;
};

// A link access list (H5P_LINK_ACCESS, or H5P_DATASET_ACCESS, which extends it) on which
// external links fail and at most one soft link is followed in a path.
Handle link_access(hid_t list_class);

// "0x..." for checksums in messages.
std::string hex(std::uint64_t v);
// Where a dataset's bytes start in the file, if they can be read straight from there:
// contiguous storage in this machine's byte order (what troupe writes). HADDR_UNDEF
// otherwise (chunked, compressed or byte-swapped: a file from elsewhere).
haddr_t raw_offset(hid_t dset, tensor::DType dtype);

}  // namespace detail

struct FileReader::Impl {
  std::string path;
  detail::Handle file;
  detail::Handle lapl;  // link_access(): for H5Oopen, H5Lget_info, H5Oget_info_by_name
  detail::Handle dapl;  // the same for H5Dopen
  detail::StringStorage strings = detail::StringStorage::fixed;
  std::uint64_t file_size = 0;  // when opened: no dataset may store more

  // "file:/model/w", the object's name made printable (it is the file's to choose).
  std::string at(std::string_view object) const { return path + ":" + printable(object); }
  bool through_hard_links(const std::string& object) const;
  detail::LinkList links(const std::string& group) const;
  std::vector<detail::Object> walk(const std::string& root) const;
  void walk(const std::string& group, int depth, std::unordered_map<haddr_t, std::string>& seen,
            std::vector<detail::Object>& out) const;
  TensorInfo describe(const std::string& dataset) const;
};

}  // namespace troupe::checkpoint
