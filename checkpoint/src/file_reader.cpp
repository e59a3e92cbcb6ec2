#include "troupe/checkpoint/file_reader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "h5_call.hpp"
#include "h5_layout.hpp"
#include "h5_types.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/format.hpp"
#include "troupe/checkpoint/printable.hpp"
#include "troupe/checkpoint/xxhash64.hpp"

namespace troupe::checkpoint {

using detail::Failure;
using detail::h5_check;
using detail::Handle;

std::size_t TensorInfo::nbytes() const {
  return static_cast<std::size_t>(tensor::shape_numel(shape)) * tensor::element_size(dtype);
}

namespace {

std::string hex(std::uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// Where a dataset's bytes start in the file, if they can be read straight from there:
// contiguous storage in this machine's byte order (what troupe writes). HADDR_UNDEF
// otherwise (chunked, compressed or byte-swapped: a file from elsewhere).
haddr_t raw_offset(hid_t dset, tensor::DType dtype) {
  const haddr_t offset = H5Dget_offset(dset);
  if (offset == HADDR_UNDEF) {
    H5Eclear2(H5E_DEFAULT);
    return HADDR_UNDEF;
  }
  Handle type(H5Dget_type(dset), H5Tclose);
  return type.get() >= 0 && H5Tequal(type.get(), detail::h5_type_of(dtype)) > 0 ? offset : HADDR_UNDEF;
}

// Reads `bytes` at `offset` of `file` into `dst`, with pread. With `hash`, a second
// thread hashes what has arrived while the rest is read, and the XXH64 of it all is
// returned (0 without): verifying a large tensor then costs about one read instead of
// a read and a hash after it, the kernel's copy and the hash running on two cores.
// Throws FormatError naming `what` on a short or failed read.
std::uint64_t read_raw(const std::string& file, haddr_t offset, std::byte* dst, std::size_t bytes, bool hash,
                       const std::string& what) {
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_os_error("open", file, errno);
  constexpr std::size_t kFailed = ~std::size_t{0};
  std::atomic<std::size_t> ready{0};  // bytes in dst, or kFailed
  std::uint64_t digest = 0;
  std::thread hasher;
  if (hash) {
    hasher = std::thread([&] {
      Xxh64 state;
      std::size_t done = 0;
      while (done < bytes) {
        const std::size_t now = ready.load(std::memory_order_acquire);
        if (now == kFailed) return;
        if (now == done) {
          ready.wait(done, std::memory_order_acquire);
          continue;
        }
        state.update(dst + done, now - done);
        done = now;
      }
      digest = state.digest();
    });
  }
  std::string error;
  int read_errno = 0;
  for (std::size_t at = 0; at < bytes;) {
    const ssize_t n = ::pread(fd, dst + at, std::min(kChunk, bytes - at), static_cast<off_t>(offset + at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      read_errno = n == 0 ? 0 : errno;
      error = n == 0 ? "file ends early (truncated?)" : errno_text(read_errno);
      break;
    }
    at += static_cast<std::size_t>(n);
    ready.store(at, std::memory_order_release);
    ready.notify_one();
  }
  if (!error.empty()) {
    ready.store(kFailed, std::memory_order_release);
    ready.notify_one();
  }
  if (hasher.joinable()) hasher.join();
  ::close(fd);
  if (read_errno != 0 && is_storage_errno(read_errno))
    TROUPE_THROW(StorageError, "checkpoint ", what, ": ", error, ", a storage error, not damage");
  if (!error.empty()) TROUPE_THROW(FormatError, "checkpoint ", what, ": ", error);
  return digest;
}

// Opens `path` and reads its first bytes with plain POSIX calls, before HDF5 sees it:
// HDF5 reports a file it cannot open or read in words that sound like damage ("file
// signature not found"), and a file that cannot be read now must not pass for a damaged
// one. Throws StorageError (or CheckpointError) naming the call, the path and errno.
void probe_readable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw_os_error("open", path, errno);
  char head[8];
  ssize_t n;
  do n = ::pread(fd, head, sizeof head, 0);
  while (n < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (n < 0) throw_os_error("pread", path, err);
}

std::string join(const std::string& group, const std::string& name) {
  return group == "/" ? "/" + name : group + "/" + name;
}

// Installed on every link access list the reader uses: an external link names another
// file, which HDF5 would open to follow it (a FIFO there blocks forever, a device or a
// network path worse). The reader refuses such links before following any; this makes
// sure one it did not see cannot open a file either.
herr_t refuse_external_link(const char*, const char*, const char*, const char*, unsigned*, hid_t, void*) { return -1; }

// A link access list (H5P_LINK_ACCESS, or H5P_DATASET_ACCESS, which extends it) on which
// external links fail and at most one soft link is followed in a path.
Handle link_access(hid_t list_class) {
  Handle list(h5_check(H5Pcreate(list_class), "H5Pcreate(link access)"), H5Pclose);
  h5_check(H5Pset_elink_cb(list.get(), refuse_external_link, nullptr), "H5Pset_elink_cb");
  h5_check(H5Pset_nlinks(list.get(), 1), "H5Pset_nlinks");
  return list;
}

std::string link_kind(H5L_type_t type) {
  if (type == H5L_TYPE_SOFT) return "a soft link";
  if (type == H5L_TYPE_EXTERNAL) return "an external link";
  return "a user-defined link (type " + std::to_string(static_cast<int>(type)) + ")";
}

// Groups nest this deep at most: troupe's are /section/name/slot, a few levels. A crafted
// file can nest thousands (each a few hundred bytes), which costs a walk its stack.
constexpr int kMaxDepth = 64;

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

// A name no HDF5 writer makes, which a path would read as something else: "" or "."
// (the group itself), or one holding a '/' (a path through other links).
bool is_path_like(std::string_view name) {
  return name.empty() || name == "." || name.find('/') != std::string_view::npos;
}

// H5Literate's callback. Nothing may throw through HDF5's C frames, so a link to refuse
// is recorded and the iteration stopped (1); the caller throws.
herr_t collect_link(hid_t group, const char* name, const H5L_info_t* link, void* data) {
  auto* list = static_cast<LinkList*>(data);
  // Looking at a soft or external link's object would follow it: only its kind is read.
  if (link->type != H5L_TYPE_HARD || is_path_like(name)) {
    list->refused = name;
    list->why = link->type != H5L_TYPE_HARD
                    ? link_kind(link->type) + "; troupe writes hard links only, and a reader follows no other kind"
                    : "a link name HDF5 would read as a path";
    return 1;
  }
  H5O_info_t info;
  if (H5Oget_info_by_name2(group, name, &info, H5O_INFO_BASIC, list->lapl) < 0) return -1;
  list->links.push_back({name, info.type, link->u.address});
  return 0;
}

// A group or dataset met walking the file, by full path.
struct Object {
  std::string path;
  H5O_type_t type;
};

}  // namespace

struct FileReader::Impl {
  std::string path;
  Handle file;
  Handle lapl;  // link_access(): for H5Oopen, H5Lget_info, H5Oget_info_by_name
  Handle dapl;  // the same for H5Dopen
  detail::StringStorage strings = detail::StringStorage::fixed;
  std::uint64_t file_size = 0;  // when opened: no dataset may store more

  // "file:/model/w", the object's name made printable (it is the file's to choose).
  std::string at(std::string_view object) const { return path + ":" + printable(object); }
  bool through_hard_links(const std::string& object) const;
  LinkList links(const std::string& group) const;
  std::vector<Object> walk(const std::string& root) const;
  void walk(const std::string& group, int depth, std::unordered_map<haddr_t, std::string>& seen,
            std::vector<Object>& out) const;
  TensorInfo describe(const std::string& dataset) const;
};

// Whether `object` (a path from the caller) exists, reached through hard links only:
// each part is looked up in turn, so none is followed before it is known to be a hard
// link. A part that is any other link is a FormatError naming it.
bool FileReader::Impl::through_hard_links(const std::string& object) const {
  if (object == "/") return true;
  for (std::size_t end = object.find('/', 1);; end = object.find('/', end + 1)) {
    const std::string part = object.substr(0, end);
    H5L_info_t link;
    if (H5Lget_info(file.get(), part.c_str(), &link, lapl.get()) < 0) {
      detail::fail_if_storage_error("checkpoint " + at(part) + ": cannot look the link up");
      return false;
    }
    if (link.type != H5L_TYPE_HARD)
      TROUPE_THROW(FormatError, "checkpoint ", at(part), ": ", link_kind(link.type),
                   "; troupe writes hard links only, and a reader follows no other kind");
    if (end == std::string::npos) return true;
  }
}

// The hard links of a group in creation order (name order for files that do not track
// it). Which one is the group's own property: falling back to name order when the
// creation order fails would list a damaged group's surviving links as if they were all.
// Any other link, and a name a path would misread (is_path_like), is a FormatError.
LinkList FileReader::Impl::links(const std::string& group) const {
  const std::string where = at(group);
  Handle g(h5_check(H5Oopen(file.get(), group.c_str(), lapl.get()), "H5Oopen " + where, Failure::format), H5Oclose);
  if (H5Iget_type(g.get()) != H5I_GROUP) TROUPE_THROW(FormatError, "checkpoint ", where, ": not a group");
  Handle gcpl(h5_check(H5Gget_create_plist(g.get()), "H5Gget_create_plist " + where, Failure::format), H5Pclose);
  unsigned order = 0;
  h5_check(H5Pget_link_creation_order(gcpl.get(), &order), "H5Pget_link_creation_order " + where, Failure::format);
  LinkList out;
  out.lapl = lapl.get();
  hsize_t idx = 0;
  h5_check(H5Literate(g.get(), (order & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME, H5_ITER_INC, &idx,
                      collect_link, &out),
           "checkpoint " + where + ": cannot list the group's links (damaged?)", Failure::format);
  if (!out.refused.empty())
    TROUPE_THROW(FormatError, "checkpoint ", where, (group == "/" ? "" : "/"), printable(out.refused), ": ", out.why);
  return out;
}

// Every group and dataset below `root`, depth first in creation order. Each object must be
// reached by one link only: a second one is a cycle (a group linking to itself or an
// ancestor: the walk would never end) or a shared object (listed twice; a chain of groups
// each linking twice to the next lists 2^depth paths from a few KB). troupe links every
// object once, so either is refused, naming both paths.
std::vector<Object> FileReader::Impl::walk(const std::string& root) const {
  H5O_info_t info;
  h5_check(H5Oget_info_by_name2(file.get(), root.c_str(), &info, H5O_INFO_BASIC, lapl.get()), "H5Oget_info " + at(root),
           Failure::format);
  std::unordered_map<haddr_t, std::string> seen{{info.addr, root}};
  std::vector<Object> out;
  walk(root, 0, seen, out);
  return out;
}

void FileReader::Impl::walk(const std::string& group, int depth, std::unordered_map<haddr_t, std::string>& seen,
                            std::vector<Object>& out) const {
  if (depth >= kMaxDepth)
    TROUPE_THROW(FormatError, "checkpoint ", at(group), ": groups nested more than ", kMaxDepth, " deep");
  for (Link& link : links(group).links) {
    std::string child = join(group, link.name);
    const auto [first, fresh] = seen.emplace(link.addr, child);
    if (!fresh)
      TROUPE_THROW(FormatError, "checkpoint ", at(child), ": a second link to the object first reached as ",
                   printable(first->second),
                   " (a link cycle, or an object shared by two groups; troupe links every object once)");
    out.push_back({child, link.type});
    if (link.type == H5O_TYPE_GROUP) walk(child, depth + 1, seen, out);
  }
}

// What a dataset holds, every size checked against what the file stores before a caller
// allocates or reads by it (detail::checked_extent, detail::check_storage).
TensorInfo FileReader::Impl::describe(const std::string& dataset) const {
  TensorInfo out;
  out.path = dataset;
  const std::string where = at(dataset);
  Handle dset(h5_check(H5Dopen2(file.get(), dataset.c_str(), dapl.get()),
                       "checkpoint " + where + ": cannot open the dataset", Failure::format),
              H5Dclose);
  out.dtype = detail::dtype_of_dataset(dset.get(), where, strings);
  const detail::Extent extent = detail::checked_extent(dset.get(), tensor::element_size(out.dtype), where);
  detail::check_storage(dset.get(), extent, file_size, where);
  out.shape = extent.shape;
  std::optional<std::uint64_t> sum = detail::read_u64_attribute(dset.get(), kAttrChecksum, where, strings);
  if (!sum) TROUPE_THROW(FormatError, "checkpoint ", where, ": no ", kAttrChecksum, " attribute");
  out.checksum = *sum;
  return out;
}

FileReader::FileReader(std::string path, ReadOptions options)
    : impl_(std::make_unique<Impl>()), path_(std::move(path)) {
  auto lock = detail::h5_lock();
  detail::h5_init();
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) TROUPE_THROW(CheckpointError, "checkpoint ", path_, ": no such file");
  if (std::filesystem::is_directory(path_, ec))
    TROUPE_THROW(CheckpointError, "checkpoint ", path_, ": is a directory, not a checkpoint file");
  probe_readable(path_);
  htri_t is_hdf5 = H5Fis_hdf5(path_.c_str());
  // Negative: HDF5 could not read the signature (an errno it quotes may be a storage
  // error, h5_fail tells); zero: it read it, and it is not HDF5's.
  if (is_hdf5 < 0) detail::h5_fail(detail::Failure::format, "checkpoint " + path_ + ": cannot read the HDF5 signature");
  if (is_hdf5 == 0) {
    H5Eclear2(H5E_DEFAULT);
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": not an HDF5 file (", std::filesystem::file_size(path_, ec),
                 " bytes, no HDF5 signature)");
  }
  impl_->path = path_;
  impl_->file_size = std::filesystem::file_size(path_, ec);
  impl_->lapl = link_access(H5P_LINK_ACCESS);
  impl_->dapl = link_access(H5P_DATASET_ACCESS);
  Handle fapl(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"), H5Pclose);
  h5_check(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), "H5Pset_fclose_degree");
  impl_->file = Handle(h5_check(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get()),
                                "checkpoint " + path_ + ": cannot open (truncated or damaged?)", Failure::format),
                       H5Fclose);
  {
    Handle root(
        h5_check(H5Oopen(impl_->file.get(), "/", impl_->lapl.get()), "H5Oopen " + path_ + ":/", Failure::format),
        H5Oclose);
    impl_->strings = detail::string_storage_of(root.get(), path_ + ":/");
  }
  // Told by the type of format_version alone: no variable-length string is read first.
  if (impl_->strings == detail::StringStorage::variable && !options.allow_format_1)
    TROUPE_THROW(FormatNotAllowed, "checkpoint ", path_, ": holds variable-length string attributes, as format 1 did; ",
                 "libhdf5 1.10 reads those unchecked (a damaged one crashes or hangs it), so such a file is read ",
                 "only when asked (ReadOptions::allow_format_1, troupe-ckpt --allow-format-1)");
  Attributes root = attributes("/");
  const AttrValue* format = root.find(kAttrFormat);
  if (!format || !std::holds_alternative<std::string>(*format) || std::get<std::string>(*format) != kFormatName)
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": not a troupe checkpoint (root attribute '", kAttrFormat, "' is ",
                 format ? printable(to_string(*format)) : std::string("missing"), ", expected \"", kFormatName, "\")");
  const AttrValue* version = root.find(kAttrFormatVersion);
  const std::string* v = version ? std::get_if<std::string>(version) : nullptr;
  int major = v ? std::atoi(v->c_str()) : 0;
  if (major < kOldestFormatMajor || major > kFormatMajor)
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": format_version ",
                 version ? printable(to_string(*version)) : std::string("missing"),
                 " is not readable by this troupe (reads major versions ", kOldestFormatMajor, " to ", kFormatMajor,
                 ")");
  if ((impl_->strings == detail::StringStorage::variable) != (major == 1))
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": format_version ", printable(*v), " is stored as a ",
                 impl_->strings == detail::StringStorage::variable ? "variable" : "fixed",
                 "-length string, which no troupe writer of that version wrote");
  if (!root.contains(kAttrComplete))
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": no 'complete' marker, the writer stopped before finishing");
}

FileReader::~FileReader() {
  auto lock = detail::h5_lock();
  impl_.reset();
}

Attributes FileReader::attributes(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  std::string where = impl_->at(g);
  impl_->through_hard_links(g);  // a missing one fails to open below, with HDF5's words
  Handle object(h5_check(H5Oopen(impl_->file.get(), g.c_str(), impl_->lapl.get()), "H5Oopen " + where, Failure::format),
                H5Oclose);
  return detail::read_attributes(object.get(), where, impl_->strings);
}

bool FileReader::has_group(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  if (g == "/") return true;
  if (!impl_->through_hard_links(g)) return false;
  H5O_info_t info;
  if (H5Oget_info_by_name2(impl_->file.get(), g.c_str(), &info, H5O_INFO_BASIC, impl_->lapl.get()) < 0) {
    detail::fail_if_storage_error("checkpoint " + path_ + ":" + g + ": cannot read the object's header");
    return false;
  }
  return info.type == H5O_TYPE_GROUP;
}

std::vector<std::string> FileReader::child_groups(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  impl_->through_hard_links(g);
  std::vector<std::string> out;
  for (const Link& link : impl_->links(g).links)
    if (link.type == H5O_TYPE_GROUP) out.push_back(link.name);
  return out;
}

std::vector<std::string> FileReader::groups(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  impl_->through_hard_links(g);
  std::vector<std::string> out;
  for (Object& o : impl_->walk(g))
    if (o.type == H5O_TYPE_GROUP) out.push_back(std::move(o.path));
  return out;
}

std::vector<TensorInfo> FileReader::tensors(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  impl_->through_hard_links(g);
  // The whole structure first, then each dataset: a cycle anywhere is found before any
  // dataset is described.
  std::vector<TensorInfo> out;
  for (const Object& o : impl_->walk(g))
    if (o.type == H5O_TYPE_DATASET) out.push_back(impl_->describe(o.path));
  return out;
}

TensorInfo FileReader::info(std::string_view path) const {
  auto lock = detail::h5_lock();
  std::string p(path);
  if (!impl_->through_hard_links(p)) TROUPE_THROW(FormatError, "checkpoint ", impl_->at(p), ": no such dataset");
  return impl_->describe(p);
}

tensor::Tensor FileReader::read(std::string_view path, bool verify) const {
  auto lock = detail::h5_lock();
  TensorInfo meta = info(path);
  tensor::Tensor t = tensor::Tensor::empty(meta.shape, meta.dtype);
  read_into(path, t, verify);
  return t;
}

void FileReader::read_into(std::string_view path, const tensor::Tensor& dst, bool verify) const {
  auto lock = detail::h5_lock();
  TensorInfo meta = info(path);
  const std::string where = impl_->at(meta.path);
  TROUPE_CHECK(dst.defined() && dst.device().is_cpu(), "checkpoint ", where, ": read_into needs a defined CPU tensor");
  TROUPE_CHECK(dst.dtype() == meta.dtype && dst.numel() == tensor::shape_numel(meta.shape), "checkpoint ", where,
               ": the file holds ", tensor::dtype_name(meta.dtype), " ", tensor::to_string(meta.shape),
               ", the destination is ", tensor::dtype_name(dst.dtype()), " ", tensor::to_string(dst.shape()));
  // Only tensors too large to stay in cache are read and hashed at once (read_raw);
  // the rest are read through HDF5 and hashed right after, from this core's cache.
  // Hashing a 8-64 MB tensor on a second core as it arrived was slower: a verified
  // cold load took 1.27x an unverified one, 1.16x with this limit (checkpoint_bench).
  constexpr std::size_t kHashWhileReading = std::size_t{64} << 20;
  std::optional<std::uint64_t> hashed;
  if (dst.numel() > 0) {
    Handle dset(h5_check(H5Dopen2(impl_->file.get(), meta.path.c_str(), impl_->dapl.get()), "H5Dopen " + where,
                         Failure::format),
                H5Dclose);
    const haddr_t offset =
        verify && dst.nbytes() >= kHashWhileReading ? raw_offset(dset.get(), meta.dtype) : HADDR_UNDEF;
    if (offset != HADDR_UNDEF) {
      hashed = read_raw(path_, offset, static_cast<std::byte*>(dst.raw_data()), dst.nbytes(), true,
                        where + ": cannot read " + std::to_string(dst.nbytes()) + " bytes");
    } else {
      h5_check(H5Dread(dset.get(), detail::h5_type_of(meta.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst.raw_data()),
               "checkpoint " + where + ": cannot read " + std::to_string(meta.nbytes()) + " bytes", Failure::format);
    }
  }
  if (verify) {
    std::uint64_t actual = hashed ? *hashed : xxh64(dst.raw_data(), dst.nbytes());
    if (actual != meta.checksum)
      TROUPE_THROW(FormatError, "checkpoint ", where, ": checksum mismatch, stored ", hex(meta.checksum),
                   ", data hashes to ", hex(actual), " (", tensor::dtype_name(meta.dtype), " ",
                   tensor::to_string(meta.shape), ")");
  }
}

tensor::Tensor FileReader::read_range(std::string_view path, std::int64_t begin, std::int64_t end) const {
  auto lock = detail::h5_lock();
  TensorInfo meta = info(path);
  TROUPE_CHECK(begin <= end, "checkpoint ", impl_->at(meta.path), ": range [", begin, ", ", end, ") is reversed");
  tensor::Tensor out = tensor::Tensor::empty({end - begin}, meta.dtype);
  read_range_into(path, begin, out);
  return out;
}

void FileReader::read_range_into(std::string_view path, std::int64_t begin, const tensor::Tensor& out) const {
  auto lock = detail::h5_lock();
  TensorInfo meta = info(path);
  const std::string where = impl_->at(meta.path);
  const std::int64_t numel = tensor::shape_numel(meta.shape);
  // Compared without forming begin + count, which a caller's huge begin would overflow.
  TROUPE_CHECK(0 <= begin && begin <= numel && out.numel() <= numel - begin, "checkpoint ", where, ": range of ",
               out.numel(), " elements from ", begin, " is outside its ", numel, " elements");
  const std::int64_t end = begin + out.numel();
  TROUPE_CHECK(out.device().is_cpu() && out.dtype() == meta.dtype, "checkpoint ", where, ": read_range_into needs a ",
               tensor::dtype_name(meta.dtype), " CPU tensor, got ", tensor::dtype_name(out.dtype()), " on ",
               out.device());
  if (end == begin) return;
  Handle dset(
      h5_check(H5Dopen2(impl_->file.get(), meta.path.c_str(), impl_->dapl.get()), "H5Dopen " + where, Failure::format),
      H5Dclose);
  const haddr_t offset = raw_offset(dset.get(), meta.dtype);
  if (offset == HADDR_UNDEF) {
    // Chunked or byte-swapped (a file from elsewhere): read it whole, keep the slice.
    tensor::Tensor all = read(path, false);
    std::memcpy(out.raw_data(), static_cast<const char*>(all.raw_data()) + begin * all.element_bytes(), out.nbytes());
    return;
  }
  read_raw(path_, offset + static_cast<haddr_t>(begin) * out.element_bytes(), static_cast<std::byte*>(out.raw_data()),
           out.nbytes(), false, troupe::detail::concat(where, ": cannot read elements [", begin, ", ", end, ")"));
}

namespace {

// A dataset whose bytes lie contiguous in the file, to be hashed straight from there.
struct RawExtent {
  const TensorInfo* tensor;
  haddr_t offset;
};

// What hashing some extents found: "" when every checksum matched; `storage` when the
// reason is a storage error (the file cannot be read now) rather than damage.
struct HashVerdict {
  std::string error;
  bool storage = false;
};

// Hashes each extent with pread into a small buffer that stays in this core's cache
// (the page cache's copy and the hash then run at cache speed, where a buffer as large
// as the tensor would miss on every line).
HashVerdict hash_extents(const std::string& file, const std::vector<RawExtent>& extents) {
  if (extents.empty()) return {};
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {troupe::detail::concat("open(", file, ") failed: ", errno_text(errno)), is_storage_errno(errno)};
  constexpr std::size_t kChunk = std::size_t{256} << 10;
  std::vector<std::byte> buffer(kChunk);
  HashVerdict verdict;
  std::string& error = verdict.error;
  for (const RawExtent& e : extents) {
    const TensorInfo& t = *e.tensor;
    Xxh64 state;
    const std::size_t bytes = t.nbytes();
    for (std::size_t at = 0; at < bytes && error.empty();) {
      const ssize_t n = ::pread(fd, buffer.data(), std::min(kChunk, bytes - at), static_cast<off_t>(e.offset + at));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n == 0 ? 0 : errno;
        verdict.storage = err != 0 && is_storage_errno(err);
        error = troupe::detail::concat(file, ":", t.path, ": cannot read ", bytes,
                                       " bytes: ", n == 0 ? "file ends early (truncated?)" : errno_text(err));
        break;
      }
      state.update(buffer.data(), static_cast<std::size_t>(n));
      at += static_cast<std::size_t>(n);
    }
    if (!error.empty()) break;
    if (const std::uint64_t actual = state.digest(); actual != t.checksum) {
      error = troupe::detail::concat(file, ":", t.path, ": checksum mismatch, stored ", hex(t.checksum),
                                     ", data hashes to ", hex(actual), " (", tensor::dtype_name(t.dtype), " ",
                                     tensor::to_string(t.shape), ")");
      break;
    }
  }
  ::close(fd);
  return verdict;
}

}  // namespace

void FileReader::verify_all() const { verify_share(0, 1); }

void FileReader::verify_share(int part, int parts) const {
  TROUPE_CHECK(parts >= 1 && part >= 0 && part < parts, "checkpoint ", path_, ": verify_share(", part, ", ", parts,
               ") names no part");
  auto lock = detail::h5_lock();
  std::vector<TensorInfo> all = tensors("/");
  if (parts > 1) {  // this part's run of about total/parts bytes: a dataset goes where it starts
    std::size_t total = 0;
    for (const TensorInfo& t : all) total += t.nbytes();
    std::vector<TensorInfo> mine;
    std::size_t at = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      // Empty datasets are spread by index so that each is still checked once.
      const std::size_t owner = total == 0 ? i % static_cast<std::size_t>(parts)
                                           : std::min<std::size_t>(at * static_cast<std::size_t>(parts) / total,
                                                                   static_cast<std::size_t>(parts) - 1);
      if (owner == static_cast<std::size_t>(part)) mine.push_back(all[i]);
      at += all[i].nbytes();
    }
    all = std::move(mine);
  }
  // Contiguous datasets in native order (all of troupe's) are hashed from the file on
  // two threads, each taking about half the bytes; the rest (a file from elsewhere:
  // chunked, compressed, byte-swapped) through HDF5 into one reused buffer.
  std::vector<RawExtent> raw;
  std::vector<const TensorInfo*> other;
  for (const TensorInfo& t : all) {
    if (t.nbytes() == 0) {
      other.push_back(&t);
      continue;
    }
    Handle dset(h5_check(H5Dopen2(impl_->file.get(), t.path.c_str(), impl_->dapl.get()), "H5Dopen " + impl_->at(t.path),
                         Failure::format),
                H5Dclose);
    const haddr_t offset = raw_offset(dset.get(), t.dtype);
    if (offset == HADDR_UNDEF)
      other.push_back(&t);
    else
      raw.push_back({&t, offset});
  }
  std::size_t total = 0;
  for (const RawExtent& e : raw) total += e.tensor->nbytes();
  std::vector<RawExtent> first, second;  // in file order each, bytes split about evenly
  std::size_t taken = 0;
  for (const RawExtent& e : raw) {
    (taken < total / 2 ? first : second).push_back(e);
    taken += e.tensor->nbytes();
  }
  HashVerdict second_verdict;
  std::thread helper;
  if (!second.empty()) helper = std::thread([&] { second_verdict = hash_extents(path_, second); });
  HashVerdict verdict = hash_extents(path_, first);
  if (helper.joinable()) helper.join();
  if (verdict.error.empty() || (second_verdict.storage && !verdict.storage)) verdict = second_verdict;
  if (verdict.storage) TROUPE_THROW(StorageError, "checkpoint ", verdict.error, ", a storage error, not damage");
  if (!verdict.error.empty()) TROUPE_THROW(FormatError, "checkpoint ", verdict.error);

  std::size_t largest = 0;
  for (const TensorInfo* t : other) largest = std::max(largest, t->nbytes());
  auto buffer = tensor::Storage::allocate(largest, tensor::Device::cpu());
  for (const TensorInfo* t : other) read_into(t->path, tensor::Tensor::from_storage(buffer, t->shape, t->dtype), true);
}

}  // namespace troupe::checkpoint
