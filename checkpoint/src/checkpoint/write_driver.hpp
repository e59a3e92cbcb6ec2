// The HDF5 file driver FileWriter writes through: sec2's POSIX calls, with one
// difference. A write that fails is not reported to HDF5 but remembered (the first
// one: errno, offset, size), and FileWriter checks for it after each call into HDF5 and
// before closing, so the save still fails with the errno and the place.
//
// Why: HDF5 1.10 cannot close a file once a flush of its metadata has failed (every
// later flush stops at "slist already enabled"). The close fails, the file's ID stays
// behind pointing to memory HDF5 has freed, and HDF5 crashes on it at exit or in
// MPI_Finalize (H5F__close_cb). Through this driver every write "succeeds" as far as
// HDF5 knows, so an unfinished file always closes; the file is then thrown away.
//
// The files are plain HDF5 files: nothing of the driver is recorded in them, and any
// reader (sec2, h5py) opens them.
#pragma once

#include <hdf5.h>

#include <sys/types.h>

#include <cstddef>

namespace troupe::checkpoint::detail {

struct WriteFailure {
  int error = 0;  // errno of the first failed write, truncate or lock; 0: none
  haddr_t offset = 0;
  std::size_t size = 0;
  const char* call = "";  // "pwrite", "ftruncate"
};

// Makes `fapl` open files through the driver (registered on first use).
void use_write_driver(hid_t fapl);
// What went wrong so far in the open file `file` (an H5F id opened through the driver).
WriteFailure write_failure_of(hid_t file);
// HDF5's end of allocation in the file: where the next block it allocates would start.
haddr_t allocated_end_of(hid_t file);
// Which file that is, to ask after it is closed: H5Fclose writes its last bytes.
struct FileId {
  dev_t device = 0;
  ino_t inode = 0;
};
FileId file_id_of(hid_t file);
// What went wrong in the file until HDF5 closed it; asked once, then forgotten.
WriteFailure write_failure_at_close(const FileId& id);

}  // namespace troupe::checkpoint::detail
