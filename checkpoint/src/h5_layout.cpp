#include "h5_layout.hpp"

#include <vector>

namespace troupe::checkpoint::detail {

void set_checkpoint_file_access(hid_t fapl) {
  // STRONG: closing the file closes everything in it, so close() really ends the file.
  h5_check(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), "H5Pset_fclose_degree");
  // The 1.8 object formats and later carry checksums on HDF5's own metadata (object
  // headers, attributes, B-trees), so a damaged attribute is an error on reading, not a
  // silently different step count; every HDF5 since 1.8 (and so h5py) reads them.
  h5_check(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST), "H5Pset_libver_bounds");
}

namespace {
void track_creation_order(hid_t plist) {
  h5_check(H5Pset_link_creation_order(plist, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED),
           "H5Pset_link_creation_order");
  h5_check(H5Pset_attr_creation_order(plist, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED),
           "H5Pset_attr_creation_order");
}
}  // namespace

Handle checkpoint_file_create_plist() {
  Handle fcpl(h5_check(H5Pcreate(H5P_FILE_CREATE), "H5Pcreate"), H5Pclose);
  track_creation_order(fcpl.get());
  return fcpl;
}

Handle checkpoint_group_create_plist() {
  Handle gcpl(h5_check(H5Pcreate(H5P_GROUP_CREATE), "H5Pcreate"), H5Pclose);
  track_creation_order(gcpl.get());
  return gcpl;
}

Handle checkpoint_dataset_create_plist() {
  Handle dcpl(h5_check(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"), H5Pclose);
  h5_check(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout");
  // Every byte is written right after creation; filling first would write the file twice.
  h5_check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  h5_check(H5Pset_attr_creation_order(dcpl.get(), H5P_CRT_ORDER_TRACKED), "H5Pset_attr_creation_order");
  return dcpl;
}

Handle dataspace_of(const tensor::Shape& shape, const std::string& where) {
  if (shape.empty()) return Handle(h5_check(H5Screate(H5S_SCALAR), "H5Screate " + where), H5Sclose);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  return Handle(h5_check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                         "H5Screate_simple " + where),
                H5Sclose);
}

void check_path(std::string_view path, const std::string& file) {
  bool bad = path.empty() || path.front() != '/' || path.find("//") != std::string_view::npos ||
             (path.size() > 1 && path.back() == '/');
  if (bad)
    TROUPE_THROW(InvalidArgument, "checkpoint ", file, ": '", path,
                 "' is not an absolute HDF5 path like /model/layers.0.weight");
}

std::string parent_of(std::string_view path) {
  auto at = path.rfind('/');
  return at == 0 ? std::string("/") : std::string(path.substr(0, at));
}

void GroupMaker::ensure(hid_t file, hid_t group_plist, std::string_view group) {
  check_path(group, file_path_);
  if (known_.count(group)) return;
  ensure(file, group_plist, parent_of(group));
  std::string name(group);
  if (h5_check(H5Lexists(file, name.c_str(), H5P_DEFAULT), "H5Lexists " + name + " in " + file_path_) <= 0) {
    Handle g(h5_check(H5Gcreate2(file, name.c_str(), H5P_DEFAULT, group_plist, H5P_DEFAULT),
                      "checkpoint " + file_path_ + ": cannot create group " + name),
             H5Gclose);
  }
  known_.insert(std::move(name));
}

}  // namespace troupe::checkpoint::detail
