// ParallelWriter: one checkpoint file written by every rank of a communicator at once.
// Each rank writes its own slice of each tensor -- no tensor is gathered on one rank,
// and a rank holds only its slices. The file is the format of FileWriter and of the
// gathered save (docs/CHECKPOINT_FORMAT.md): same names, dtypes, attributes and
// checksums, bit for bit in every tensor; only where HDF5 puts its metadata may differ.
//
// Contract (checked): every method is collective. All ranks call them in the same
// order with the same arguments -- same path, dtype and full shape, same attribute
// values -- and only the slices differ. The slices of a tensor must tile it: no
// overlap, no gap, in any order of ranks; a rank may hold none. Each call first
// compares the ranks' arguments (small allgathers), so disagreeing ranks and bad slices
// get an InvalidArgument on *every* rank, naming the tensor and both versions, before
// the file is touched. An I/O failure on any rank is likewise made known to all and
// thrown on every rank with the failing rank's message. Exceptions therefore leave the
// ranks in step, and their destructors close the file together.
//
// write_all() in phases (write() is write_all() of one tensor):
//   1. agree_on_slices: the arguments compared, the slices checked to tile each tensor;
//   2. create_datasets: rank 0 alone lays the datasets out through a FileWriter --
//      contiguous, their bytes allocated (and reserved) at once, never filled -- and
//      broadcasts where each one's bytes start. The HDF5 structure is small and one
//      process writes it, through FileWriter's write driver: a failed metadata flush is
//      an error, not HDF5 1.10's crash at exit that the MPI-IO driver left behind;
//   3. chain_checksums: a dataset's XXH64 covers all its bytes, which no rank has. In
//      order of offset, the rank with the first range hashes it and sends the hash
//      state (Xxh64::State, ~100 bytes) to the rank with the next range, and so on; the
//      last finishes the digest. The chains of all tensors run as one pipeline, and one
//      allreduce shares the digests;
//   4. write_bytes: each rank pwrite()s its slices at their offsets on its own
//      descriptor, exchanging no message until all its tensors are written (with
//      ParallelOptions::collective_buffering, one MPI_File_write_at_all per tensor
//      through MPI-IO's aggregators instead);
//   5. rank 0 stamps the digests.
//
// Durability: close() fsyncs every rank's descriptor (on a parallel file system, from
// each node); then rank 0 writes "complete" and closes the HDF5 file, each of its writes
// checked. Making the file a checkpoint (fsync, rename, `latest`) is
// ParallelCheckpoint's job (parallel_checkpoint.hpp).
//
// MPI: the communicator is duplicated for the writer's own messages. Everything runs on
// the caller's thread, under the checkpoint module's HDF5 lock (the installed HDF5 is
// not thread-safe).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/checkpoint/attribute.hpp"
#include "troupe/checkpoint/save_manifest.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::checkpoint {

// A rank's piece of one tensor: elements [begin, begin + data.numel()) of the full
// tensor in flat C order (data's own shape does not matter, only its element count and
// dtype). Slice{} (undefined data) is no piece. CUDA tensors are copied to the host.
struct Slice {
  std::int64_t begin = 0;
  tensor::Tensor data;
  // Rows [first_row, first_row + rows.size(0)) along dim 0 of a tensor whose other
  // dimensions are rows' own: the slice a rank of a dim-0 sharding holds.
  static Slice rows(std::int64_t first_row, tensor::Tensor rows);
};

struct ParallelOptions {
  // How the bytes travel. false (the default): each rank pwrite()s its own bytes at
  // their offsets in the file, because a checkpoint slice is one long contiguous run
  // that needs no reshuffling, and two-phase I/O would funnel the bytes of a node
  // through one aggregator rank -- what this mode exists to avoid. true: a collective
  // MPI_File_write_at_all per tensor with MPI-IO's collective buffering, where aggregator ranks
  // gather and write; kept settable for many small or interleaved slices on a parallel
  // file system, and for the benchmark.
  bool collective_buffering = false;
};

class ParallelWriter {
 public:
  // Collective. Creates (truncating) `path` -- the same path on every rank, on a file
  // system every rank sees -- and stamps format and format_version on the root.
  ParallelWriter(std::string path, MPI_Comm comm, ParallelOptions options = {});
  ParallelWriter(const ParallelWriter&) = delete;
  ParallelWriter& operator=(const ParallelWriter&) = delete;
  // Collective if close() was not called: closes the file without the complete marker,
  // so readers reject it.
  ~ParallelWriter();

  // Collective: an attribute of a group ("/", "/sampler"), created if needed. Every rank
  // passes the same value (compared).
  void set_attribute(std::string_view group, std::string_view name, const AttrValue& value);
  // Collective: creates the group ("/rng") and its parents if they do not exist yet.
  void ensure_group(std::string_view group);
  // Collective: creates the dataset `spec` (full shape, contiguous) and writes this
  // rank's slice into it, then its dtype and xxh64 attributes.
  void write(const TensorSpec& spec, const Slice& slice);
  // Collective: write() for every tensor of `specs`, slices[i] being this rank's piece of
  // specs[i], in one agreement and one pass. `written(i)`, if given, runs once this
  // rank's bytes of tensor i are handed to the file.
  void write_all(std::span<const TensorSpec> specs, std::span<const Slice> slices,
                 const std::function<void(std::size_t)>& written = {});
  // Collective: syncs every rank's writes, marks the file complete and closes it.
  void close();

  const std::string& path() const { return path_; }
  int rank() const;
  int size() const;
  // Bytes of tensor data this rank wrote.
  std::size_t bytes_written() const { return bytes_written_; }

 private:
  struct Impl;
  struct Layout;  // what phases 1 and 2 of write_all() work out, per tensor
  // The phases of write_all(). agree_on_slices returns each tensor's checksum chain: the
  // ranks holding its slices, in order of offset.
  std::vector<std::vector<int>> agree_on_slices(std::span<const TensorSpec> specs, std::span<const Slice> slices,
                                                Layout& layout);
  void create_datasets(std::span<const TensorSpec> specs, Layout& layout);
  std::vector<std::uint64_t> chain_checksums(std::span<const Slice> slices,
                                             const std::vector<std::vector<int>>& chains);
  void write_bytes(std::span<const TensorSpec> specs, std::span<const Slice> slices, const Layout& layout,
                   const std::function<void(std::size_t)>& written);
  static tensor::Tensor on_host(const Slice& slice);

  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::size_t bytes_written_ = 0;
};

}  // namespace troupe::checkpoint
