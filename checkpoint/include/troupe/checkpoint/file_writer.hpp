// FileWriter: streams tensors and attributes into one checkpoint file (HDF5), one
// tensor at a time.
//
// Each write_tensor() goes straight to the file: a contiguous, uncompressed dataset in
// the tensor's native dtype (f16 as IEEE half, bf16 as uint16 words with dtype="bf16"),
// hashed with XXH64 on the way. The writer never holds more than the tensor it was given
// plus HDF5's small metadata cache, so saving a model needs memory for its largest
// tensor only when the caller hands tensors over one by one.
//
// Paths are absolute HDF5 paths, "/model/layers.0.weight"; missing groups are created.
// Groups record link creation order so readers list tensors in the order written.
// close() writes the root "complete" attribute last and closes the file; it does not
// fsync (DurableFile does that around it). The file's blocks are reserved (fallocate)
// ahead of every write, so a full disk fails a write before HDF5 caches anything it
// cannot flush: HDF5 1.10 cannot close a file whose flush failed, and crashes on it at
// exit. The reservation beyond HDF5's end of allocation is trimmed at close. A writer destroyed without close() leaves
// a file without "complete", which readers reject. Not thread-safe: one writer per thread, and HDF5 itself must not be
// entered from two threads at once (see h5_call.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "troupe/checkpoint/attribute.hpp"
#include "troupe/checkpoint/sink.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::checkpoint {

class FileWriter final : public Sink {
 public:
  // Creates (truncating) `path` and stamps format and format_version on the root.
  explicit FileWriter(std::string path);
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  ~FileWriter() override;

  // Sets an attribute on a group ("/" or "/sampler"), creating the group if needed.
  void set_attribute(std::string_view group, std::string_view name, const AttrValue& value) override;
  // Writes `t` (CPU or CUDA; copied to the host first if needed) at `path`.
  void write_tensor(std::string_view path, const tensor::Tensor& t) override;
  // Piecewise writing, for tensors that arrive in pieces from several ranks (the
  // checkpoint actor): create_dataset allocates the dataset's bytes in the file at once
  // (contiguous, so each element has a fixed file offset), write_range puts a piece of
  // its flat C-order bytes at `byte_offset` with one pwrite (pieces in any order, no
  // assembly buffer), and finish_dataset, once every byte is there, reads the dataset
  // back through a fixed 4 MB buffer to compute its checksum and stamps it.
  // create_dataset returns where the dataset's bytes start in the file (0 when it has
  // none): other processes may write them there (ParallelWriter's ranks).
  std::uint64_t create_dataset(std::string_view path, tensor::DType dtype, const tensor::Shape& shape);
  void write_range(std::string_view path, std::size_t byte_offset, const void* data, std::size_t size);
  void finish_dataset(std::string_view path);
  // Stamps a checksum computed elsewhere (over bytes other processes wrote), reading
  // nothing back.
  void finish_dataset(std::string_view path, std::uint64_t checksum);

  // A host tensor of `shape` and `dtype` in a buffer the writer owns and reuses: the
  // "fixed buffer" of a streaming save. A source that must build each tensor (assembling
  // shards, converting) fills it and passes it to write_tensor, so memory stays at the
  // largest tensor however many there are; allocating a fresh tensor each time instead
  // lets the allocator's fragmentation grow the heap (glibc keeps the freed blocks).
  // The tensor is valid until the next scratch() call, which may reuse its bytes.
  tensor::Tensor scratch(const tensor::Shape& shape, tensor::DType dtype) override;
  // Creates an empty group, so a section with nothing in it still shows in the file.
  void ensure_group(std::string_view group) override;

  // Marks the file complete and closes it; throws CheckpointError if HDF5 cannot.
  void close();
  const std::string& path() const { return path_; }
  std::size_t bytes_written() const { return bytes_written_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<tensor::Storage> scratch_;
  int raw_fd_ = -1;  // for write_range/finish_dataset, opened on first use
  // Closes a file that will not be finished (see the destructor).
  void abandon() noexcept;
  // Reserves the file's blocks up to HDF5's end of allocation plus `ahead` bytes (see
  // above); throws StorageError (ENOSPC) when the disk has not got them.
  void reserve(std::size_t ahead);
  int raw_fd();  // raw_fd_, opened on first use
  // Throws the first write HDF5's driver could not do (src/checkpoint/write_driver.hpp).
  void check_writes() const;
  std::uint64_t reserved_ = 0;
  bool reservable_ = true;  // false where the file system has no fallocate
  std::string path_;
  std::size_t bytes_written_ = 0;
};

}  // namespace troupe::checkpoint
