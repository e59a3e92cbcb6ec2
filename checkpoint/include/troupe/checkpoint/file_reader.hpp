// FileReader: opens a checkpoint file, lists what is in it, and reads tensors back
// bit for bit, verifying each one's XXH64 checksum.
//
// Opening checks that the file is HDF5, that its root says format="troupe-checkpoint"
// with a major version this reader knows, and that it carries the "complete" marker;
// anything else is a FormatError naming the file and what is wrong. read() loads one
// dataset into a new CPU tensor and, when asked (the default), recomputes its checksum:
// a mismatch is a FormatError naming the file, the dataset and both digests.
//
// The file is hostile until checked (docs/CHECKPOINT_FORMAT.md, "Hostile files"): every
// size it declares is checked against what it stores and against the file's own size
// before anything is allocated or read; a link other than a hard link (soft, external,
// user-defined) is refused by name and never followed, nor is a dataset whose data lives
// outside the file (external storage, virtual); a group or dataset reached by a second
// link (a cycle) is refused. All of it is metadata: the checks read no tensor data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/checkpoint/attribute.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::checkpoint {

struct TensorInfo {
  std::string path;  // "/model/layers.0.weight"
  tensor::DType dtype = tensor::DType::f32;
  tensor::Shape shape;
  std::uint64_t checksum = 0;
  std::size_t nbytes() const;
};

// A sound file in a format this reader reads only when asked (format 1): not damage.
class FormatNotAllowed : public FormatError {
 public:
  using FormatError::FormatError;
};

struct ReadOptions {
  // Format 1 files keep their string attributes variable-length, in HDF5's global heap,
  // which libhdf5 1.10 reads without bounds checks: a damaged or crafted heap object
  // crashes or hangs the reader (docs/TESTING.md). So they are read only when asked
  // (troupe-ckpt --allow-format-1); otherwise one is a FormatNotAllowed before any is read.
  bool allow_format_1 = false;
};

class FileReader {
 public:
  explicit FileReader(std::string path, ReadOptions options = {});
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  ~FileReader();

  const std::string& path() const { return path_; }
  // Attributes of a group ("/" for the root metadata).
  Attributes attributes(std::string_view group = "/") const;
  bool has_group(std::string_view group) const;
  // Direct child groups of `group`, in creation order ("/" -> "model", "optimizer", ...).
  std::vector<std::string> child_groups(std::string_view group = "/") const;
  // Every group below `group`, recursively, depth first in creation order, as full paths
  // ("/optimizer", "/optimizer/fc.weight", ...). Walks a crafted file safely, where
  // calling child_groups recursively would go round a link cycle forever.
  std::vector<std::string> groups(std::string_view group = "/") const;
  // Every dataset under `group`, recursively, in creation order.
  std::vector<TensorInfo> tensors(std::string_view group = "/") const;
  TensorInfo info(std::string_view path) const;

  tensor::Tensor read(std::string_view path, bool verify = true) const;
  // Reads the dataset into `dst` (CPU, same dtype and element count, e.g. a live model
  // parameter), so a load needs no memory of its own.
  void read_into(std::string_view path, const tensor::Tensor& dst, bool verify = true) const;
  // Elements [begin, end) of the dataset in flat C order, as a 1-D tensor: how a rank
  // takes its shard of a full tensor when the world size differs from the one that
  // saved it. Reads only those bytes (one pread at the contiguous dataset's offset). A
  // slice cannot be checked against the whole tensor's checksum: verify the file once
  // (verify_all, or Checkpoint::load_latest) before trusting slices.
  tensor::Tensor read_range(std::string_view path, std::int64_t begin, std::int64_t end) const;
  // The same range, elements [begin, begin + dst.numel()), straight into `dst` (CPU, the
  // dataset's dtype): a sharded resume reads into its shards with no buffer of its own.
  void read_range_into(std::string_view path, std::int64_t begin, const tensor::Tensor& dst) const;
  // Checks every dataset's checksum and throws FormatError naming the first that does
  // not match (or cannot be read). Contiguous datasets (all that troupe writes) are
  // hashed straight from the file by two threads, through small cache-resident
  // buffers; any other dataset is read through HDF5 into one reused buffer.
  void verify_all() const;
  // verify_all's share `part` of `parts` (0 <= part < parts): the datasets in file order
  // cut into `parts` runs of about equal bytes, so that ranks verifying one part each
  // check every checksum once between them (a sharded resume) instead of each reading
  // the whole file.
  void verify_share(int part, int parts) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace troupe::checkpoint
