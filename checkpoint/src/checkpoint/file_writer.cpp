#include "troupe/checkpoint/file_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "h5_call.hpp"
#include "h5_layout.hpp"
#include "h5_types.hpp"
#include "troupe/checkpoint/format.hpp"
#include "troupe/checkpoint/xxhash64.hpp"
#include "write_driver.hpp"

namespace troupe::checkpoint {

using detail::h5_check;
using detail::Handle;

struct FileWriter::Impl {
  struct Piecewise {
    haddr_t file_offset;
    std::size_t nbytes;
  };
  std::map<std::string, Piecewise, std::less<>> piecewise;  // created, not yet finished
  Handle file;
  Handle group_plist;    // creation order tracked for links and attributes
  Handle dataset_plist;  // contiguous, never filled, attribute order tracked
  std::unique_ptr<detail::GroupMaker> groups;
};

using detail::check_path;
using detail::parent_of;

FileWriter::FileWriter(std::string path) : impl_(std::make_unique<Impl>()), path_(std::move(path)) {
  auto lock = detail::h5_lock();
  detail::h5_init();
  Handle fapl(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"), H5Pclose);
  detail::set_checkpoint_file_access(fapl.get());
  detail::use_write_driver(fapl.get());
  Handle fcpl = detail::checkpoint_file_create_plist();
  impl_->file = Handle(
      h5_check(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), "checkpoint: cannot create " + path_),
      H5Fclose);
  impl_->group_plist = detail::checkpoint_group_create_plist();
  impl_->dataset_plist = detail::checkpoint_dataset_create_plist();
  impl_->groups = std::make_unique<detail::GroupMaker>(path_);

  try {
    set_attribute("/", kAttrFormat, std::string(kFormatName));
    set_attribute("/", kAttrFormatVersion, std::string(kFormatVersion));
    reserve(0);
  } catch (...) {
    abandon();  // no destructor runs for a constructor that throws
    if (raw_fd_ >= 0) ::close(std::exchange(raw_fd_, -1));
    throw;
  }
}

namespace {
// Room kept ahead of HDF5's end of allocation for metadata (object headers, heaps,
// B-trees: a few kB a tensor) and small datasets, which HDF5 places there between
// reservations. Grows with the file, so a large file makes few fallocate calls.
std::uint64_t slack_for(std::uint64_t eoa) { return std::max<std::uint64_t>(std::uint64_t{64} << 10, eoa / 16); }
}  // namespace

void FileWriter::check_writes() const {
  const detail::WriteFailure f = detail::write_failure_of(impl_->file.get());
  if (f.error != 0)
    throw_os_error(f.call, path_ + " at byte " + std::to_string(f.offset) + ", " + std::to_string(f.size) + " bytes",
                   f.error);
}

int FileWriter::raw_fd() {
  if (raw_fd_ < 0) {
    raw_fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (raw_fd_ < 0) throw_os_error("open", path_, errno);
  }
  return raw_fd_;
}

void FileWriter::reserve(std::size_t ahead) {
  if (!reservable_) return;
  const haddr_t eoa = detail::allocated_end_of(impl_->file.get());
  const std::uint64_t needed = eoa + ahead + (std::uint64_t{16} << 10);
  if (needed <= reserved_) return;
  const std::uint64_t want = eoa + ahead + slack_for(eoa);
  if (::fallocate(raw_fd(), 0, 0, static_cast<off_t>(want)) != 0) {
    if (errno == EOPNOTSUPP || errno == ENOSYS) {
      reservable_ = false;
      return;
    }
    throw_os_error("fallocate", path_ + ", " + std::to_string(want) + " bytes", errno);
  }
  reserved_ = want;
}

FileWriter::~FileWriter() {
  auto lock = detail::h5_lock();
  if (impl_->file.valid()) abandon();
  impl_.reset();
  if (raw_fd_ >= 0) ::close(raw_fd_);
}

// A file left unfinished (a write failed, or the save was given up) is never read: it
// lacks the complete marker. HDF5 still flushes its metadata when closing it, and if
// that fails (the disk that just filled up) HDF5 keeps an ID whose file it has already
// freed, and crashes on it at exit or in MPI_Finalize (H5F__close_cb). So the file's
// bytes are given back first: with the data gone, the few kilobytes of metadata fit.
void FileWriter::abandon() noexcept {
  impl_->groups.reset();
  impl_->dataset_plist.reset();
  impl_->group_plist.reset();
  // With the blocks reserved, the flush writes inside them and cannot run out of room.
  // Without (no fallocate here), the file's bytes are given back first, so that the few
  // kilobytes of metadata a close writes have room.
  if (!reservable_) {
    const int fd = raw_fd_ >= 0 ? raw_fd_ : ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      [[maybe_unused]] const int truncated = ::ftruncate(fd, 0);
      if (fd != raw_fd_) ::close(fd);
    }
  }
  std::optional<detail::FileId> id;
  try {
    if (impl_->file.valid()) id = detail::file_id_of(impl_->file.get());
  } catch (const Error&) {
  }
  if (impl_->file.reset() < 0) H5Eclear2(H5E_DEFAULT);
  if (id) detail::write_failure_at_close(*id);  // the file is given up: its failures with it
}

std::uint64_t FileWriter::create_dataset(std::string_view path, tensor::DType dtype, const tensor::Shape& shape) {
  auto lock = detail::h5_lock();
  check_path(path, path_);
  std::string name(path);
  std::string where = path_ + ":" + name;
  TROUPE_CHECK(!impl_->piecewise.count(name), "checkpoint ", where, ": created twice");
  ensure_group(parent_of(path));
  Handle space = detail::dataspace_of(shape, where);
  Handle dcpl(h5_check(H5Pcopy(impl_->dataset_plist.get()), "H5Pcopy"), H5Pclose);
  // Early: the bytes get their place in the file now, so pieces can go straight there.
  h5_check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
  Handle dset(h5_check(H5Dcreate2(impl_->file.get(), name.c_str(), detail::h5_type_of(dtype), space.get(), H5P_DEFAULT,
                                  dcpl.get(), H5P_DEFAULT),
                       "checkpoint: cannot create dataset " + where),
              H5Dclose);
  std::size_t nbytes = static_cast<std::size_t>(tensor::shape_numel(shape)) * tensor::element_size(dtype);
  haddr_t offset = nbytes ? H5Dget_offset(dset.get()) : 0;
  if (nbytes && offset == HADDR_UNDEF) detail::h5_fail(detail::Failure::io, "H5Dget_offset " + where);
  detail::write_attribute(dset.get(), kAttrDType, std::string(tensor::dtype_name(dtype)), where);
  impl_->piecewise[name] = {offset, nbytes};
  reserve(0);  // the dataset's bytes are allocated already: below the end of allocation
  raw_fd();
  check_writes();
  return offset;
}

void FileWriter::write_range(std::string_view path, std::size_t byte_offset, const void* data, std::size_t size) {
  auto lock = detail::h5_lock();
  auto it = impl_->piecewise.find(path);
  TROUPE_CHECK(it != impl_->piecewise.end(), "checkpoint ", path_, ":", path,
               ": write_range before create_dataset (or after finish_dataset)");
  TROUPE_CHECK(byte_offset + size <= it->second.nbytes, "checkpoint ", path_, ":", path, ": piece [", byte_offset, ", ",
               byte_offset + size, ") is past the tensor's ", it->second.nbytes, " bytes");
  const char* p = static_cast<const char*>(data);
  off_t at = static_cast<off_t>(it->second.file_offset + byte_offset);
  while (size > 0) {
    ssize_t n = ::pwrite(raw_fd_, p, size, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_os_error("pwrite", troupe::detail::concat(path_, ", tensor ", path), errno);
    if (n == 0) TROUPE_THROW(StorageError, "checkpoint: pwrite of ", path, " in ", path_, " wrote nothing");
    p += n;
    at += n;
    size -= static_cast<std::size_t>(n);
  }
  bytes_written_ += static_cast<std::size_t>(p - static_cast<const char*>(data));
}

void FileWriter::finish_dataset(std::string_view path) {
  auto lock = detail::h5_lock();
  auto it = impl_->piecewise.find(path);
  TROUPE_CHECK(it != impl_->piecewise.end(), "checkpoint ", path_, ":", path,
               ": finish_dataset without create_dataset");
  constexpr std::size_t kChunk = 4 << 20;
  std::vector<char> buffer(std::min(kChunk, it->second.nbytes));
  Xxh64 hash;
  for (std::size_t done = 0; done < it->second.nbytes;) {
    std::size_t want = std::min(buffer.size(), it->second.nbytes - done);
    ssize_t n = ::pread(raw_fd_, buffer.data(), want, static_cast<off_t>(it->second.file_offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_os_error("pread", troupe::detail::concat(path_, ", tensor ", path), errno);
    if (n == 0)
      TROUPE_THROW(CheckpointError, "checkpoint: pread of ", path, " in ", path_,
                   " failed: end of file (pieces missing?)");
    hash.update(buffer.data(), static_cast<std::size_t>(n));
    done += static_cast<std::size_t>(n);
  }
  finish_dataset(path, hash.digest());
}

void FileWriter::finish_dataset(std::string_view path, std::uint64_t checksum) {
  auto lock = detail::h5_lock();
  auto it = impl_->piecewise.find(path);
  TROUPE_CHECK(it != impl_->piecewise.end(), "checkpoint ", path_, ":", path,
               ": finish_dataset without create_dataset");
  std::string name(path);
  Handle dset(h5_check(H5Dopen2(impl_->file.get(), name.c_str(), H5P_DEFAULT), "H5Dopen " + name), H5Dclose);
  detail::write_u64_attribute(dset.get(), kAttrChecksum, checksum, path_ + ":" + name);
  impl_->piecewise.erase(it);
  check_writes();
}

void FileWriter::ensure_group(std::string_view group) {
  auto lock = detail::h5_lock();
  TROUPE_CHECK(impl_->file.valid(), "checkpoint ", path_, ": write after close()");
  impl_->groups->ensure(impl_->file.get(), impl_->group_plist.get(), group);
}

void FileWriter::set_attribute(std::string_view group, std::string_view name, const AttrValue& value) {
  auto lock = detail::h5_lock();
  ensure_group(group);
  std::string g(group);
  std::string where = path_ + ":" + g;
  Handle object(h5_check(H5Oopen(impl_->file.get(), g.c_str(), H5P_DEFAULT), "H5Oopen " + where), H5Oclose);
  detail::write_attribute(object.get(), name, value, where);
}

void FileWriter::write_tensor(std::string_view path, const tensor::Tensor& t) {
  auto lock = detail::h5_lock();
  check_path(path, path_);
  std::string name(path);
  std::string where = path_ + ":" + name;
  TROUPE_CHECK(t.defined(), "checkpoint ", where, ": tensor is undefined");
  ensure_group(parent_of(path));

  tensor::Tensor host = t.device().is_cpu() ? t : t.to(tensor::Device::cpu());
  const void* data = host.raw_data();
  // The checksum is computed on another core while HDF5 copies the same bytes into the
  // page cache: the two read one buffer, and hashing no longer adds to the save's time.
  // Small tensors are not worth a thread.
  constexpr std::size_t kHashAside = 1 << 20;
  std::future<std::uint64_t> hashing;
  std::uint64_t checksum = 0;
  if (host.nbytes() >= kHashAside)
    hashing = std::async(std::launch::async, [data, n = host.nbytes()] { return xxh64(data, n); });
  else
    checksum = xxh64(data, host.nbytes());

  Handle space = detail::dataspace_of(host.shape(), where);
  hid_t type = detail::h5_type_of(host.dtype());
  reserve(host.nbytes());  // where the dataset's bytes will go, before HDF5 takes them
  Handle dset(h5_check(H5Dcreate2(impl_->file.get(), name.c_str(), type, space.get(), H5P_DEFAULT,
                                  impl_->dataset_plist.get(), H5P_DEFAULT),
                       "checkpoint: cannot create dataset " + where + " (" +
                           std::string(tensor::dtype_name(host.dtype())) + " " + tensor::to_string(host.shape()) + ")"),
              H5Dclose);
  // Memory type == file type: HDF5 converts nothing and hands the buffer to write(2).
  herr_t written = host.numel() > 0 ? H5Dwrite(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) : 0;
  if (hashing.valid()) checksum = hashing.get();  // joined before any throw below
  h5_check(written, "checkpoint: cannot write " + where + " (" + std::to_string(host.nbytes()) + " bytes)");
  detail::write_attribute(dset.get(), kAttrDType, std::string(tensor::dtype_name(host.dtype())), where);
  detail::write_u64_attribute(dset.get(), kAttrChecksum, checksum, where);
  // Closing writes what HDF5 kept back (its sieve buffer holds up to 64 kB of a small
  // dataset): a failure there is a failed write, not one to drop with the handle.
  h5_check(dset.reset(), "checkpoint: cannot write " + where + " (" + std::to_string(host.nbytes()) + " bytes)");
  check_writes();
  bytes_written_ += host.nbytes();
}

tensor::Tensor FileWriter::scratch(const tensor::Shape& shape, tensor::DType dtype) {
  std::size_t nbytes = static_cast<std::size_t>(tensor::shape_numel(shape)) * tensor::element_size(dtype);
  if (!scratch_ || scratch_->nbytes() < nbytes) {
    scratch_.reset();  // free the old buffer before taking the bigger one
    scratch_ = tensor::Storage::allocate(nbytes, tensor::Device::cpu());
  }
  return tensor::Tensor::from_storage(scratch_, shape, dtype);
}

void FileWriter::close() {
  auto lock = detail::h5_lock();
  TROUPE_CHECK(impl_->file.valid(), "checkpoint ", path_, ": close() called twice");
  TROUPE_CHECK(impl_->piecewise.empty(), "checkpoint ", path_, ": close() with ", impl_->piecewise.size(),
               " datasets created but not finished, e.g. ", impl_->piecewise.begin()->first);
  set_attribute("/", kAttrComplete, std::int64_t{1});
  impl_->dataset_plist.reset();
  impl_->group_plist.reset();
  reserve(0);
  h5_check(H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL), "checkpoint: cannot flush " + path_);
  check_writes();
  const haddr_t eoa = detail::allocated_end_of(impl_->file.get());
  const detail::FileId id = detail::file_id_of(impl_->file.get());
  if (impl_->file.reset() < 0) detail::h5_fail(detail::Failure::io, "checkpoint: cannot close " + path_);
  if (const detail::WriteFailure f = detail::write_failure_at_close(id); f.error != 0)
    throw_os_error(f.call, path_ + " at byte " + std::to_string(f.offset) + " while closing", f.error);
  // The reservation beyond the end of allocation is not part of the file.
  if (reserved_ > eoa && ::ftruncate(raw_fd(), static_cast<off_t>(eoa)) != 0) throw_os_error("ftruncate", path_, errno);
  if (raw_fd_ >= 0 && ::close(std::exchange(raw_fd_, -1)) != 0) throw_os_error("close", path_, errno);
}

}  // namespace troupe::checkpoint
