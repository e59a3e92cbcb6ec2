// The checkpoint module's error type. Corrupt, truncated or foreign files throw
// troupe::FormatError (the file holds something that is not what it claims); failures
// of the operating system or of HDF5 while writing or reading throw CheckpointError.
// Both messages name the file and the dataset or attribute, plus HDF5's own words.
#pragma once

#include "troupe/error.hpp"

namespace troupe::checkpoint {

class CheckpointError : public Error {
 public:
  using Error::Error;
};

}  // namespace troupe::checkpoint
