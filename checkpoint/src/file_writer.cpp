#include "troupe/checkpoint/file_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <utility>
#include <vector>

#include "h5_call.hpp"
#include "h5_layout.hpp"
#include "h5_types.hpp"
#include "troupe/checkpoint/format.hpp"
#include "troupe/checkpoint/xxhash64.hpp"

namespace troupe::checkpoint {

using detail::Handle;
using detail::h5_check;

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
  Handle fcpl = detail::checkpoint_file_create_plist();
  impl_->file = Handle(h5_check(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()),
                                "checkpoint: cannot create " + path_),
                       H5Fclose);
  impl_->group_plist = detail::checkpoint_group_create_plist();
  impl_->dataset_plist = detail::checkpoint_dataset_create_plist();
  impl_->groups = std::make_unique<detail::GroupMaker>(path_);

  set_attribute("/", kAttrFormat, std::string(kFormatName));
  set_attribute("/", kAttrFormatVersion, std::string(kFormatVersion));
}

FileWriter::~FileWriter() {
  auto lock = detail::h5_lock();
  impl_.reset();  // closes without the complete marker: readers will reject the file
  if (raw_fd_ >= 0) ::close(raw_fd_);
}

void FileWriter::create_dataset(std::string_view path, tensor::DType dtype, const tensor::Shape& shape) {
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
  Handle dset(h5_check(H5Dcreate2(impl_->file.get(), name.c_str(), detail::h5_type_of(dtype), space.get(),
                                  H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                       "checkpoint: cannot create dataset " + where),
              H5Dclose);
  std::size_t nbytes = static_cast<std::size_t>(tensor::shape_numel(shape)) * tensor::element_size(dtype);
  haddr_t offset = nbytes ? H5Dget_offset(dset.get()) : 0;
  if (nbytes && offset == HADDR_UNDEF) detail::h5_fail(detail::Failure::io, "H5Dget_offset " + where);
  detail::write_attribute(dset.get(), kAttrDType, std::string(tensor::dtype_name(dtype)), where);
  impl_->piecewise[name] = {offset, nbytes};
  if (raw_fd_ < 0) {
    raw_fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    if (raw_fd_ < 0) TROUPE_THROW(CheckpointError, "checkpoint: open(", path_, ") failed: ", std::strerror(errno));
  }
}

void FileWriter::write_range(std::string_view path, std::size_t byte_offset, const void* data, std::size_t size) {
  auto lock = detail::h5_lock();
  auto it = impl_->piecewise.find(path);
  TROUPE_CHECK(it != impl_->piecewise.end(), "checkpoint ", path_, ":", path,
               ": write_range before create_dataset (or after finish_dataset)");
  TROUPE_CHECK(byte_offset + size <= it->second.nbytes, "checkpoint ", path_, ":", path, ": piece [",
               byte_offset, ", ", byte_offset + size, ") is past the tensor's ", it->second.nbytes, " bytes");
  const char* p = static_cast<const char*>(data);
  off_t at = static_cast<off_t>(it->second.file_offset + byte_offset);
  while (size > 0) {
    ssize_t n = ::pwrite(raw_fd_, p, size, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) TROUPE_THROW(CheckpointError, "checkpoint: pwrite of ", path, " in ", path_, " failed: ", std::strerror(errno));
    p += n;
    at += n;
    size -= static_cast<std::size_t>(n);
  }
  bytes_written_ += static_cast<std::size_t>(p - static_cast<const char*>(data));
}

void FileWriter::finish_dataset(std::string_view path) {
  auto lock = detail::h5_lock();
  auto it = impl_->piecewise.find(path);
  TROUPE_CHECK(it != impl_->piecewise.end(), "checkpoint ", path_, ":", path, ": finish_dataset without create_dataset");
  constexpr std::size_t kChunk = 4 << 20;
  std::vector<char> buffer(std::min(kChunk, it->second.nbytes));
  Xxh64 hash;
  for (std::size_t done = 0; done < it->second.nbytes;) {
    std::size_t want = std::min(buffer.size(), it->second.nbytes - done);
    ssize_t n = ::pread(raw_fd_, buffer.data(), want, static_cast<off_t>(it->second.file_offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) TROUPE_THROW(CheckpointError, "checkpoint: pread of ", path, " in ", path_, " failed: ",
                             n == 0 ? "end of file (pieces missing?)" : std::strerror(errno));
    hash.update(buffer.data(), static_cast<std::size_t>(n));
    done += static_cast<std::size_t>(n);
  }
  std::string name(path);
  Handle dset(h5_check(H5Dopen2(impl_->file.get(), name.c_str(), H5P_DEFAULT), "H5Dopen " + name), H5Dclose);
  detail::write_u64_attribute(dset.get(), kAttrChecksum, hash.digest(), path_ + ":" + name);
  impl_->piecewise.erase(it);
}

void FileWriter::ensure_group(std::string_view group) {
  auto lock = detail::h5_lock();
  TROUPE_CHECK(impl_->file.valid(), "checkpoint ", path_, ": write after close()");
  impl_->groups->ensure(impl_->file.get(), impl_->group_plist.get(), group);
}

void FileWriter::set_attribute(std::string_view group, std::string_view name,
                               const AttrValue& value) {
  auto lock = detail::h5_lock();
  ensure_group(group);
  std::string g(group);
  std::string where = path_ + ":" + g;
  Handle object(h5_check(H5Oopen(impl_->file.get(), g.c_str(), H5P_DEFAULT), "H5Oopen " + where),
                H5Oclose);
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
  Handle dset(h5_check(H5Dcreate2(impl_->file.get(), name.c_str(), type, space.get(), H5P_DEFAULT,
                                  impl_->dataset_plist.get(), H5P_DEFAULT),
                       "checkpoint: cannot create dataset " + where + " (" +
                           std::string(tensor::dtype_name(host.dtype())) + " " +
                           tensor::to_string(host.shape()) + ")"),
              H5Dclose);
  // Memory type == file type: HDF5 converts nothing and hands the buffer to write(2).
  herr_t written = host.numel() > 0 ? H5Dwrite(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) : 0;
  if (hashing.valid()) checksum = hashing.get();  // joined before any throw below
  h5_check(written, "checkpoint: cannot write " + where + " (" + std::to_string(host.nbytes()) + " bytes)");
  detail::write_attribute(dset.get(), kAttrDType, std::string(tensor::dtype_name(host.dtype())),
                          where);
  detail::write_u64_attribute(dset.get(), kAttrChecksum, checksum, where);
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
  h5_check(H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL), "checkpoint: cannot flush " + path_);
  if (impl_->file.reset() < 0) detail::h5_fail(detail::Failure::io, "checkpoint: cannot close " + path_);
  if (raw_fd_ >= 0 && ::close(std::exchange(raw_fd_, -1)) != 0)
    TROUPE_THROW(CheckpointError, "checkpoint: close(", path_, ") failed: ", std::strerror(errno));
}

}  // namespace troupe::checkpoint
