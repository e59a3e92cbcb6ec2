#include "write_driver.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <new>
#include <utility>

#include "h5_call.hpp"

namespace troupe::checkpoint::detail {

namespace {

// Failures of files HDF5 has closed, by (device, inode), until write_failure_at_close
// takes them: the last writes of a file happen inside H5Fclose. Touched under h5_lock.
std::map<std::pair<dev_t, ino_t>, WriteFailure>& closed_failures() {
  static std::map<std::pair<dev_t, ino_t>, WriteFailure> failures;
  return failures;
}

struct DriverFile {
  H5FD_t pub;  // first: HDF5 sees a DriverFile* as an H5FD_t*
  int fd = -1;
  haddr_t eoa = 0;
  haddr_t eof = 0;
  dev_t device = 0;
  ino_t inode = 0;
  WriteFailure failure;
};

DriverFile* self(H5FD_t* file) { return reinterpret_cast<DriverFile*>(file); }
const DriverFile* self(const H5FD_t* file) { return reinterpret_cast<const DriverFile*>(file); }

constexpr haddr_t kMaxAddr = (haddr_t{1} << (8 * sizeof(off_t) - 1)) - 1;

// An error HDF5 reports on: the errno in the words HDF5's own drivers use, which
// h5_call's classifier reads ("errno = 28").
herr_t fail(const char* call, int err) {
  H5Epush2(H5E_DEFAULT, __FILE__, call, __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_CANTOPENFILE,
           "troupe write driver: %s failed, errno = %d, error message = '%s'", call, err, std::strerror(err));
  return -1;
}

void remember(DriverFile* f, const char* call, int err, haddr_t offset, std::size_t size) {
  if (f->failure.error == 0) f->failure = {err, offset, size, call};
}

H5FD_t* open_file(const char* name, unsigned flags, hid_t, haddr_t maxaddr) {
  if (maxaddr == 0 || maxaddr > kMaxAddr) {
    fail("open", EINVAL);
    return nullptr;
  }
  int mode = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) mode |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) mode |= O_CREAT;
  if (flags & H5F_ACC_EXCL) mode |= O_EXCL;
  const int fd = ::open(name, mode | O_CLOEXEC, 0666);
  if (fd < 0) {
    fail("open", errno);
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fstat", err);
    return nullptr;
  }
  auto* f = new (std::nothrow) DriverFile{};
  if (!f) {
    ::close(fd);
    fail("open", ENOMEM);
    return nullptr;
  }
  f->fd = fd;
  f->eof = static_cast<haddr_t>(st.st_size);
  f->device = st.st_dev;
  f->inode = st.st_ino;
  return &f->pub;
}

herr_t close_file(H5FD_t* file) {
  DriverFile* f = self(file);
  // What the disk did with the bytes is fsync's to say (the commit's); what HDF5 could
  // not even write is kept for FileWriter.
  if (::close(f->fd) != 0) remember(f, "close", errno, f->eof, 0);
  if (f->failure.error != 0) closed_failures()[{f->device, f->inode}] = f->failure;
  delete f;
  return 0;
}

int compare(const H5FD_t* a, const H5FD_t* b) {
  const DriverFile *x = self(a), *y = self(b);
  if (x->device != y->device) return x->device < y->device ? -1 : 1;
  if (x->inode != y->inode) return x->inode < y->inode ? -1 : 1;
  return 0;
}

herr_t query(const H5FD_t*, unsigned long* flags) {
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
           H5FD_FEAT_AGGREGATE_SMALLDATA | H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
  return 0;
}

haddr_t get_eoa(const H5FD_t* file, H5FD_mem_t) { return self(file)->eoa; }
herr_t set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  self(file)->eoa = addr;
  return 0;
}
haddr_t get_eof(const H5FD_t* file, H5FD_mem_t) { return self(file)->eof; }

herr_t get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = &self(file)->fd;
  return 0;
}

herr_t read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, std::size_t size, void* buffer) {
  DriverFile* f = self(file);
  auto* out = static_cast<unsigned char*>(buffer);
  while (size > 0) {
    const ssize_t n = ::pread(f->fd, out, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("pread", errno);
    if (n == 0) {  // past the end: zeros, as sec2 reads an address allocated but not yet written
      std::memset(out, 0, size);
      break;
    }
    out += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

herr_t write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, std::size_t size, const void* buffer) {
  DriverFile* f = self(file);
  const auto* in = static_cast<const unsigned char*>(buffer);
  const haddr_t end = addr + size;
  while (size > 0) {
    const ssize_t n = ::pwrite(f->fd, in, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      remember(f, "pwrite", n < 0 ? errno : EIO, addr, size);
      break;
    }
    in += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<std::size_t>(n);
  }
  f->eof = std::max(f->eof, end);
  return 0;
}

herr_t truncate(H5FD_t* file, hid_t, hbool_t) {
  DriverFile* f = self(file);
  if (f->eoa == f->eof) return 0;
  if (::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0) remember(f, "ftruncate", errno, f->eoa, 0);
  f->eof = f->eoa;
  return 0;
}

herr_t lock(H5FD_t* file, hbool_t rw) {
  if (::flock(self(file)->fd, (rw ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0 && errno != ENOSYS) return fail("flock", errno);
  return 0;
}

herr_t unlock(H5FD_t* file) {
  if (::flock(self(file)->fd, LOCK_UN) != 0 && errno != ENOSYS) return fail("flock", errno);
  return 0;
}

H5FD_class_t make_class() {
  H5FD_class_t c{};
  c.name = "troupe_write";
  c.maxaddr = kMaxAddr;
  c.fc_degree = H5F_CLOSE_WEAK;
  c.open = open_file;
  c.close = close_file;
  c.cmp = compare;
  c.query = query;
  c.get_eoa = get_eoa;
  c.set_eoa = set_eoa;
  c.get_eof = get_eof;
  c.get_handle = get_handle;
  c.read = read;
  c.write = write;
  c.truncate = truncate;
  c.lock = lock;
  c.unlock = unlock;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;  // sec2's, so the files lay out alike
  std::copy(std::begin(map), std::end(map), std::begin(c.fl_map));
  return c;
}

hid_t driver() {
  static const H5FD_class_t cls = make_class();
  static hid_t id = -1;
  // Registered again if HDF5 was closed and reopened since (the id is then invalid).
  if (id < 0 || H5Iis_valid(id) <= 0) id = h5_check(H5FDregister(&cls), "H5FDregister (troupe write driver)");
  return id;
}

}  // namespace

void use_write_driver(hid_t fapl) {
  auto lock = h5_lock();
  h5_check(H5Pset_driver(fapl, driver(), nullptr), "H5Pset_driver (troupe write driver)");
}

WriteFailure write_failure_at_close(const FileId& id) {
  auto lock = h5_lock();
  auto& failures = closed_failures();
  const auto it = failures.find({id.device, id.inode});
  if (it == failures.end()) return {};
  const WriteFailure failure = it->second;
  failures.erase(it);
  return failure;
}

namespace {
const DriverFile& driver_file_of(hid_t file) {
  void* handle = nullptr;
  h5_check(H5Fget_vfd_handle(file, H5P_DEFAULT, &handle), "H5Fget_vfd_handle");
  const auto* fd = static_cast<const int*>(handle);  // get_handle gives &DriverFile::fd
  return *reinterpret_cast<const DriverFile*>(reinterpret_cast<const char*>(fd) - offsetof(DriverFile, fd));
}
}  // namespace

FileId file_id_of(hid_t file) {
  const DriverFile& f = driver_file_of(file);
  return {f.device, f.inode};
}

WriteFailure write_failure_of(hid_t file) { return driver_file_of(file).failure; }

haddr_t allocated_end_of(hid_t file) { return driver_file_of(file).eoa; }

}  // namespace troupe::checkpoint::detail
