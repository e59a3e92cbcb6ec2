// The checkpoint module's error types. Three kinds of failure, told apart because each
// asks for a different answer (docs/CHECKPOINT_FAULTS.md):
//   FormatError      damage: the file holds something that is not what it claims
//                    (a bad checksum, structure or size). Resume skips to an older file.
//   StorageError     the file cannot be read or written now (EIO, EACCES, ESTALE, a lock,
//                    EMFILE, ENOSPC...): not damage. Resume retries, then fails loudly;
//                    it never takes an older file or starts over because of one.
//   CheckpointError  anything else the operating system or HDF5 refused.
// Every message names the file and the dataset or attribute, plus HDF5's own words.
#pragma once

#include <string>

#include "troupe/error.hpp"

namespace troupe::checkpoint {

class CheckpointError : public Error {
 public:
  using Error::Error;
};

class StorageError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// Whether errno value `err` is a condition of the storage (it may pass, or be fixed by
// an operator) rather than a property of the file: EIO, EACCES, ESTALE, EAGAIN, EMFILE,
// ENOSPC, EROFS, ETIMEDOUT and their kin.
bool is_storage_errno(int err);

// "EIO (Input/output error)".
std::string errno_text(int err);

// Throws StorageError when `err` is a storage errno, CheckpointError otherwise, with
// "checkpoint: <call>(<what>) failed: <errno_text>".
[[noreturn]] void throw_os_error(const std::string& call, const std::string& what, int err);

}  // namespace troupe::checkpoint
