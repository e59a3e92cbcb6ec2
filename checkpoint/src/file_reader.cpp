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

#include "h5_call.hpp"
#include "h5_types.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/format.hpp"
#include "troupe/checkpoint/xxhash64.hpp"

namespace troupe::checkpoint {

using detail::Failure;
using detail::Handle;
using detail::h5_check;

struct FileReader::Impl {
  Handle file;
  detail::StringStorage strings = detail::StringStorage::fixed;
};

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

struct LinkList {
  std::vector<std::pair<std::string, H5O_type_t>> links;
};

herr_t collect_link(hid_t group, const char* name, const H5L_info_t*, void* data) {
  H5O_info_t info;
  if (H5Oget_info_by_name2(group, name, &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
  static_cast<LinkList*>(data)->links.emplace_back(name, info.type);
  return 0;
}

// The links of a group in creation order (name order for files that do not track it).
// Which one is the group's own property: falling back to name order when the creation
// order fails would list a damaged group's surviving links as if they were all.
LinkList list_links(hid_t file, const std::string& group, const std::string& where) {
  Handle g(h5_check(H5Gopen2(file, group.c_str(), H5P_DEFAULT), "H5Gopen " + where,
                    Failure::format),
           H5Gclose);
  Handle gcpl(h5_check(H5Gget_create_plist(g.get()), "H5Gget_create_plist " + where, Failure::format),
              H5Pclose);
  unsigned order = 0;
  h5_check(H5Pget_link_creation_order(gcpl.get(), &order), "H5Pget_link_creation_order " + where,
           Failure::format);
  LinkList out;
  hsize_t idx = 0;
  h5_check(H5Literate(g.get(), (order & H5P_CRT_ORDER_TRACKED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME,
                      H5_ITER_INC, &idx, collect_link, &out),
           "checkpoint " + where + ": cannot list the group's links (damaged?)", Failure::format);
  return out;
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

}  // namespace

FileReader::FileReader(std::string path) : impl_(std::make_unique<Impl>()), path_(std::move(path)) {
  auto lock = detail::h5_lock();
  detail::h5_init();
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec))
    TROUPE_THROW(CheckpointError, "checkpoint ", path_, ": no such file");
  if (std::filesystem::is_directory(path_, ec))
    TROUPE_THROW(CheckpointError, "checkpoint ", path_, ": is a directory, not a checkpoint file");
  probe_readable(path_);
  htri_t is_hdf5 = H5Fis_hdf5(path_.c_str());
  if (is_hdf5 <= 0) {
    H5Eclear2(H5E_DEFAULT);
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": not an HDF5 file (",
                 std::filesystem::file_size(path_, ec), " bytes, no HDF5 signature)");
  }
  Handle fapl(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"), H5Pclose);
  h5_check(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), "H5Pset_fclose_degree");
  impl_->file = Handle(h5_check(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get()),
                                "checkpoint " + path_ + ": cannot open (truncated or damaged?)",
                                Failure::format),
                       H5Fclose);
  {
    Handle root(h5_check(H5Oopen(impl_->file.get(), "/", H5P_DEFAULT), "H5Oopen " + path_ + ":/",
                         Failure::format),
                H5Oclose);
    impl_->strings = detail::string_storage_of(root.get(), path_ + ":/");
  }
  Attributes root = attributes("/");
  const AttrValue* format = root.find(kAttrFormat);
  if (!format || !std::holds_alternative<std::string>(*format) ||
      std::get<std::string>(*format) != kFormatName)
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": not a troupe checkpoint (root attribute '",
                 kAttrFormat, "' is ", format ? to_string(*format) : std::string("missing"),
                 ", expected \"", kFormatName, "\")");
  const AttrValue* version = root.find(kAttrFormatVersion);
  const std::string* v = version ? std::get_if<std::string>(version) : nullptr;
  int major = v ? std::atoi(v->c_str()) : 0;
  if (major < kOldestFormatMajor || major > kFormatMajor)
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": format_version ",
                 version ? to_string(*version) : std::string("missing"),
                 " is not readable by this troupe (reads major versions ", kOldestFormatMajor,
                 " to ", kFormatMajor, ")");
  if ((impl_->strings == detail::StringStorage::variable) != (major == 1))
    TROUPE_THROW(FormatError, "checkpoint ", path_, ": format_version ", *v, " is stored as a ",
                 impl_->strings == detail::StringStorage::variable ? "variable" : "fixed",
                 "-length string, which no troupe writer of that version wrote");
  if (!root.contains(kAttrComplete))
    TROUPE_THROW(FormatError, "checkpoint ", path_,
                 ": no 'complete' marker, the writer stopped before finishing");
}

FileReader::~FileReader() {
  auto lock = detail::h5_lock();
  impl_.reset();
}

Attributes FileReader::attributes(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  std::string where = path_ + ":" + g;
  Handle object(h5_check(H5Oopen(impl_->file.get(), g.c_str(), H5P_DEFAULT), "H5Oopen " + where,
                         Failure::format),
                H5Oclose);
  return detail::read_attributes(object.get(), where, impl_->strings);
}

bool FileReader::has_group(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  if (g == "/") return true;
  // H5Lexists needs every parent to exist, so walk down one level at a time.
  std::string prefix;
  std::size_t start = 1;
  while (start <= g.size()) {
    std::size_t end = g.find('/', start);
    if (end == std::string::npos) end = g.size();
    prefix = g.substr(0, end);
    if (H5Lexists(impl_->file.get(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    start = end + 1;
  }
  H5O_info_t info;
  if (H5Oget_info_by_name2(impl_->file.get(), g.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
    return false;
  return info.type == H5O_TYPE_GROUP;
}

std::vector<std::string> FileReader::child_groups(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  std::vector<std::string> out;
  for (auto& [name, type] : list_links(impl_->file.get(), g, path_ + ":" + g).links)
    if (type == H5O_TYPE_GROUP) out.push_back(name);
  return out;
}

std::vector<TensorInfo> FileReader::tensors(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::vector<TensorInfo> out;
  std::vector<std::string> pending{std::string(group)};
  // Depth first, in creation order, so the listing matches the order tensors were saved.
  auto visit = [&](auto&& self, const std::string& g) -> void {
    for (auto& [name, type] : list_links(impl_->file.get(), g, path_ + ":" + g).links) {
      std::string child = join(g, name);
      if (type == H5O_TYPE_GROUP) self(self, child);
      else if (type == H5O_TYPE_DATASET) out.push_back(info(child));
    }
  };
  visit(visit, std::string(group));
  return out;
}

TensorInfo FileReader::info(std::string_view path) const {
  auto lock = detail::h5_lock();
  TensorInfo out;
  out.path = std::string(path);
  std::string where = path_ + ":" + out.path;
  Handle dset(h5_check(H5Dopen2(impl_->file.get(), out.path.c_str(), H5P_DEFAULT),
                       "checkpoint " + where + ": no such dataset", Failure::format),
              H5Dclose);
  out.dtype = detail::dtype_of_dataset(dset.get(), where, impl_->strings);
  Handle space(h5_check(H5Dget_space(dset.get()), "H5Dget_space " + where, Failure::format),
               H5Sclose);
  int rank = h5_check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims " + where,
                      Failure::format);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  out.shape.assign(dims.begin(), dims.end());
  std::optional<std::uint64_t> sum = detail::read_u64_attribute(dset.get(), kAttrChecksum, where, impl_->strings);
  if (!sum) TROUPE_THROW(FormatError, "checkpoint ", where, ": no ", kAttrChecksum, " attribute");
  out.checksum = *sum;
  return out;
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
  std::string where = path_ + ":" + meta.path;
  TROUPE_CHECK(dst.defined() && dst.device().is_cpu(), "checkpoint ", where,
               ": read_into needs a defined CPU tensor");
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
    Handle dset(h5_check(H5Dopen2(impl_->file.get(), meta.path.c_str(), H5P_DEFAULT),
                         "H5Dopen " + where, Failure::format),
                H5Dclose);
    const haddr_t offset = verify && dst.nbytes() >= kHashWhileReading ? raw_offset(dset.get(), meta.dtype) : HADDR_UNDEF;
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
      TROUPE_THROW(FormatError, "checkpoint ", where, ": checksum mismatch, stored ",
                   hex(meta.checksum), ", data hashes to ", hex(actual), " (",
                   tensor::dtype_name(meta.dtype), " ", tensor::to_string(meta.shape), ")");
  }
}

tensor::Tensor FileReader::read_range(std::string_view path, std::int64_t begin, std::int64_t end) const {
  auto lock = detail::h5_lock();
  TensorInfo meta = info(path);
  TROUPE_CHECK(begin <= end, "checkpoint ", path_, ":", meta.path, ": range [", begin, ", ", end, ") is reversed");
  tensor::Tensor out = tensor::Tensor::empty({end - begin}, meta.dtype);
  read_range_into(path, begin, out);
  return out;
}

void FileReader::read_range_into(std::string_view path, std::int64_t begin, const tensor::Tensor& out) const {
  auto lock = detail::h5_lock();
  TensorInfo meta = info(path);
  std::string where = path_ + ":" + meta.path;
  std::int64_t numel = tensor::shape_numel(meta.shape);
  const std::int64_t end = begin + out.numel();
  TROUPE_CHECK(0 <= begin && end <= numel, "checkpoint ", where, ": range [", begin, ", ", end,
               ") is outside its ", numel, " elements");
  TROUPE_CHECK(out.device().is_cpu() && out.dtype() == meta.dtype, "checkpoint ", where, ": read_range_into needs a ",
               tensor::dtype_name(meta.dtype), " CPU tensor, got ", tensor::dtype_name(out.dtype()), " on ", out.device());
  if (end == begin) return;
  Handle dset(h5_check(H5Dopen2(impl_->file.get(), meta.path.c_str(), H5P_DEFAULT), "H5Dopen " + where,
                       Failure::format),
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
        error = troupe::detail::concat(file, ":", t.path, ": cannot read ", bytes, " bytes: ",
                                       n == 0 ? "file ends early (truncated?)" : errno_text(err));
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
    Handle dset(h5_check(H5Dopen2(impl_->file.get(), t.path.c_str(), H5P_DEFAULT), "H5Dopen " + path_ + ":" + t.path,
                         Failure::format),
                H5Dclose);
    const haddr_t offset = raw_offset(dset.get(), t.dtype);
    if (offset == HADDR_UNDEF) other.push_back(&t);
    else raw.push_back({&t, offset});
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
  for (const TensorInfo* t : other)
    read_into(t->path, tensor::Tensor::from_storage(buffer, t->shape, t->dtype), true);
}

}  // namespace troupe::checkpoint
