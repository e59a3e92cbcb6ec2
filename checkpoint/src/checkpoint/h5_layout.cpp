#include "h5_layout.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "troupe/checkpoint/printable.hpp"

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
  return Handle(
      h5_check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple " + where),
      H5Sclose);
}

namespace {

constexpr std::uint64_t kInt64Max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

// a * b, or nullopt when it exceeds int64 (the tensor library's sizes are int64).
std::optional<std::uint64_t> product(std::uint64_t a, std::uint64_t b) {
  std::uint64_t p = 0;
  if (__builtin_mul_overflow(a, b, &p) || p > kInt64Max) return std::nullopt;
  return p;
}

}  // namespace

Extent checked_extent(hid_t dataset, std::size_t item_size, const std::string& where) {
  Handle space(h5_check(H5Dget_space(dataset), "H5Dget_space " + where, Failure::format), H5Sclose);
  const H5S_class_t kind = H5Sget_simple_extent_type(space.get());
  if (kind == H5S_NULL)
    TROUPE_THROW(FormatError, "checkpoint ", where, ": a null dataspace (not even a scalar), which no tensor has");
  if (kind != H5S_SCALAR && kind != H5S_SIMPLE)
    TROUPE_THROW(FormatError, "checkpoint ", where, ": a dataspace of unknown class ", static_cast<int>(kind));
  const int rank =
      h5_check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims " + where, Failure::format);
  if (rank > kMaxRank)
    TROUPE_THROW(FormatError, "checkpoint ", where, ": rank ", rank, ", above HDF5's limit of ", kMaxRank);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0)
    h5_check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims " + where,
             Failure::format);
  // Multiplied out one dimension at a time: a file may declare [2^32, 2^32], whose
  // element count wraps to 0 in 64 bits and would pass any later check as empty.
  Extent out;
  out.item_size = item_size;
  out.count = 1;
  for (const hsize_t d : dims) {
    const std::optional<std::uint64_t> count = product(out.count, d);
    if (!count)
      TROUPE_THROW(FormatError, "checkpoint ", where, ": dimensions ", dims_text(dims),
                   " hold more than 2^63-1 elements (overflow)");
    out.count = *count;
    out.shape.push_back(static_cast<std::int64_t>(d));
  }
  const std::optional<std::uint64_t> bytes = product(out.count, item_size);
  if (!bytes)
    TROUPE_THROW(FormatError, "checkpoint ", where, ": ", out.count, " elements of ", item_size,
                 " bytes each are more than 2^63-1 bytes (overflow)");
  out.bytes = *bytes;
  return out;
}

namespace {

// Deflate's best case: 258 repeated bytes for a 2-bit code, about 1032:1. No stream of n
// bytes inflates to more than 1032 n, so chunks of n bytes cannot back more than that.
constexpr std::uint64_t kDeflateMaxRatio = 1032;
// Chunks of at most this many bytes are taken whatever the dataset's size (h5py gives a
// dataset with a 0-length dimension chunks of up to 1024 elements there).
constexpr std::uint64_t kSmallChunk = std::uint64_t{1} << 20;

// The filters a reader runs on chunks, and the most a chunk of n bytes can expand to:
// deflate 1032 n, shuffle and fletcher32 n. Any other filter is refused: scale-offset and
// n-bit make any size from a few bytes, and an unknown one makes HDF5 load a plugin.
std::uint64_t max_expansion(hid_t dcpl, const std::string& where) {
  const int filters = h5_check(H5Pget_nfilters(dcpl), "H5Pget_nfilters " + where, Failure::format);
  std::uint64_t ratio = 1;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    std::size_t values = 0;
    char name[64] = {};
    const H5Z_filter_t id =
        h5_check(H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &values, nullptr, sizeof name, name, &config),
                 "H5Pget_filter2 " + where, Failure::format);
    if (id == H5Z_FILTER_DEFLATE)
      ratio = kDeflateMaxRatio;
    else if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_FLETCHER32)
      TROUPE_THROW(FormatError, "checkpoint ", where, ": chunks pass through HDF5 filter ", id, " '",
                   printable(std::string_view(name, strnlen(name, sizeof name))),
                   "', which a troupe reader does not run (only deflate, shuffle and fletcher32)");
  }
  return ratio;
}

void check_chunks(hid_t dcpl, const Extent& extent, std::uint64_t stored, const std::string& where) {
  std::vector<hsize_t> chunk(kMaxRank);
  const int rank = h5_check(H5Pget_chunk(dcpl, kMaxRank, chunk.data()), "H5Pget_chunk " + where, Failure::format);
  if (rank != static_cast<int>(extent.shape.size()))
    TROUPE_THROW(FormatError, "checkpoint ", where, ": chunks of rank ", rank, " for a dataset of rank ",
                 extent.shape.size());
  chunk.resize(static_cast<std::size_t>(rank));
  // HDF5 holds a whole chunk in memory to read any of it.
  std::optional<std::uint64_t> chunk_bytes = extent.item_size;
  for (const hsize_t d : chunk) chunk_bytes = d == 0 || !chunk_bytes ? std::nullopt : product(*chunk_bytes, d);
  if (!chunk_bytes || *chunk_bytes > std::max(extent.bytes, kSmallChunk))
    TROUPE_THROW(FormatError, "checkpoint ", where, ": chunks of ", dims_text(chunk), " elements for a dataset of ",
                 extent.bytes, " bytes");
  const std::uint64_t ratio = max_expansion(dcpl, where);
  if ((extent.bytes + ratio - 1) / ratio > stored)
    TROUPE_THROW(FormatError, "checkpoint ", where, ": declares ", extent.count, " elements (", extent.bytes,
                 " bytes) but its chunks store ", stored, " bytes, which ",
                 ratio == 1 ? "hold no more" : "inflate to at most " + std::to_string(ratio) + " times that",
                 " (chunks missing?)");
}

}  // namespace

void check_storage(hid_t dataset, const Extent& extent, std::uint64_t file_size, const std::string& where) {
  Handle dcpl(h5_check(H5Dget_create_plist(dataset), "H5Dget_create_plist " + where, Failure::format), H5Pclose);
  // Checked before anything else about the data: reading it would open those files.
  const int external = h5_check(H5Pget_external_count(dcpl.get()), "H5Pget_external_count " + where, Failure::format);
  if (external > 0)
    TROUPE_THROW(FormatError, "checkpoint ", where, ": its data is kept in ", external,
                 " external file(s) (HDF5 external storage), outside the checkpoint; refused, never opened");
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_VIRTUAL)
    TROUPE_THROW(FormatError, "checkpoint ", where,
                 ": a virtual dataset, whose data is kept in other files; refused, never opened");
  const std::uint64_t stored = H5Dget_storage_size(dataset);
  if (stored > file_size)
    TROUPE_THROW(FormatError, "checkpoint ", where, ": stores ", stored, " bytes, more than the whole file (",
                 file_size, " bytes)");
  switch (layout) {
    case H5D_CONTIGUOUS:
    case H5D_COMPACT: {
      if (stored != extent.bytes)
        TROUPE_THROW(FormatError, "checkpoint ", where, ": declares ", extent.count, " elements (", extent.bytes,
                     " bytes) but stores ", stored, " bytes");
      const haddr_t offset = layout == H5D_CONTIGUOUS && stored > 0 ? H5Dget_offset(dataset) : 0;
      if (offset == HADDR_UNDEF || offset > file_size - stored)
        TROUPE_THROW(FormatError, "checkpoint ", where, ": its ", stored, " bytes at offset ",
                     offset == HADDR_UNDEF ? std::string("(none)") : std::to_string(offset),
                     " are not inside the file (", file_size, " bytes)");
      return;
    }
    case H5D_CHUNKED: check_chunks(dcpl.get(), extent, stored, where); return;
    default:
      TROUPE_THROW(FormatError, "checkpoint ", where, ": storage layout ", static_cast<int>(layout),
                   " is none a troupe reader knows (contiguous, compact, chunked)");
  }
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
