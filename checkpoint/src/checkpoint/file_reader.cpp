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

#include "file_reader_impl.hpp"
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
using detail::hex;
using detail::raw_offset;

std::size_t TensorInfo::nbytes() const {
  return static_cast<std::size_t>(tensor::shape_numel(shape)) * tensor::element_size(dtype);
}

namespace detail {

std::string hex(std::uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

haddr_t raw_offset(hid_t dset, tensor::DType dtype) {
  const haddr_t offset = H5Dget_offset(dset);
  if (offset == HADDR_UNDEF) {
    H5Eclear2(H5E_DEFAULT);
    return HADDR_UNDEF;
  }
  Handle type(H5Dget_type(dset), H5Tclose);
  return type.get() >= 0 && H5Tequal(type.get(), detail::h5_type_of(dtype)) > 0 ? offset : HADDR_UNDEF;
}

}  // namespace detail

namespace {

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

}  // namespace

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
  impl_->lapl = detail::link_access(H5P_LINK_ACCESS);
  impl_->dapl = detail::link_access(H5P_DATASET_ACCESS);
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
  for (const detail::Link& link : impl_->links(g).links)
    if (link.type == H5O_TYPE_GROUP) out.push_back(link.name);
  return out;
}

std::vector<std::string> FileReader::groups(std::string_view group) const {
  auto lock = detail::h5_lock();
  std::string g(group);
  impl_->through_hard_links(g);
  std::vector<std::string> out;
  for (detail::Object& o : impl_->walk(g))
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
  for (const detail::Object& o : impl_->walk(g))
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

}  // namespace troupe::checkpoint
