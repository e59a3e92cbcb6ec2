// The parallel writer in phases: agree on the arguments, rank 0 lays the datasets out,
// the checksums chained across ranks, every rank writes its bytes, rank 0 stamps the
// checksums (see the header).
#include "troupe/checkpoint/parallel_writer.hpp"

#include <fcntl.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <span>
#include <vector>

#include "durable_file.hpp"
#include "h5_call.hpp"
#include "h5_layout.hpp"
#include "rank_agreement.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/file_writer.hpp"
#include "troupe/checkpoint/xxhash64.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::checkpoint {

using Range = detail::RankAgreement::Range;

namespace {

// Tag of the hash-state messages on the writer's own communicator.
constexpr int kHashTag = 1;

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  TROUPE_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  return dup;
}

std::string mpi_message(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

std::string describe(const TensorSpec& spec) {
  std::string shape = "[";
  for (std::size_t i = 0; i < spec.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(spec.shape[i]);
  return spec.path + " " + spec.dtype + " " + shape + "]";
}

// The slices of one tensor must tile [0, numel): checked on every rank from the same
// allgathered ranges, so every rank reaches the same verdict and message. Returns the
// ranks holding non-empty slices in order of offset: the checksum chain.
std::vector<int> check_tiling(const std::vector<Range>& ranges, std::int64_t numel, const std::string& what,
                              const detail::RankAgreement& agreement) {
  auto slice = [&](int r) {
    const Range& s = ranges[static_cast<std::size_t>(r)];
    return "rank " + std::to_string(r) + "'s slice [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ")";
  };
  std::vector<int> order;
  for (int r = 0; r < static_cast<int>(ranges.size()); ++r)
    if (ranges[static_cast<std::size_t>(r)].end > ranges[static_cast<std::size_t>(r)].begin) order.push_back(r);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return ranges[static_cast<std::size_t>(a)].begin < ranges[static_cast<std::size_t>(b)].begin;
  });
  std::int64_t covered = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Range& s = ranges[static_cast<std::size_t>(order[i])];
    if (s.begin < covered)
      agreement.fail(detail::RankAgreement::kInvalidArgument,
                     what + ": " + slice(order[i - 1]) + " and " + slice(order[i]) + " overlap");
    if (s.begin > covered)
      agreement.fail(detail::RankAgreement::kInvalidArgument,
                     what + ": elements [" + std::to_string(covered) + ", " + std::to_string(s.begin) +
                         ") are in no rank's slice (a gap before " + slice(order[i]) + ")");
    covered = s.end;
  }
  if (covered != numel)
    agreement.fail(detail::RankAgreement::kInvalidArgument, what + ": elements [" + std::to_string(covered) + ", " +
                                                                std::to_string(numel) +
                                                                ") are in no rank's slice (the slices end early)");
  return order;
}

}  // namespace

Slice Slice::rows(std::int64_t first_row, tensor::Tensor rows) {
  TROUPE_CHECK(rows.defined() && rows.dim() >= 1, "Slice::rows: needs a tensor with a dim 0, got ",
               rows.defined() ? tensor::to_string(rows.shape()) : std::string("an undefined tensor"));
  tensor::Shape row(rows.shape().begin() + 1, rows.shape().end());
  return Slice{first_row * tensor::shape_numel(row), std::move(rows)};
}

struct ParallelWriter::Layout {
  std::vector<tensor::DType> dtypes;
  std::vector<std::int64_t> numels;
  std::vector<Range> mine;             // this rank's elements
  std::vector<std::uint64_t> offsets;  // where the dataset's bytes start in the file
};

struct ParallelWriter::Impl {
  explicit Impl(MPI_Comm parent) : comm(duplicate(parent)), agreement(comm) {}
  ~Impl() {
    file.reset();  // rank 0's: unfinished, it is abandoned (no "complete")
    data.reset();
    if (mpi_file != MPI_FILE_NULL) MPI_File_close(&mpi_file);  // collective: every rank is here
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
  }
  MPI_Comm comm;
  detail::RankAgreement agreement;
  bool open = true;
  // Rank 0's: the HDF5 structure, attributes and checksums, through FileWriter and so
  // through its write driver and reservations (write_driver.hpp, file_writer.hpp).
  std::unique_ptr<FileWriter> file;
  // Every rank's descriptor for its own bytes; or, with collective buffering, the file
  // opened through MPI-IO.
  std::unique_ptr<detail::PosixFile> data;
  MPI_File mpi_file = MPI_FILE_NULL;

  bool root() const { return agreement.rank() == 0; }
};

ParallelWriter::ParallelWriter(std::string path, MPI_Comm comm, ParallelOptions options)
    : impl_(std::make_unique<Impl>(comm)), path_(std::move(path)) {
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  m.agreement.set_context("checkpoint " + path_ + " (parallel save, rank " + std::to_string(m.agreement.rank()) +
                          " of " + std::to_string(m.agreement.size()) + ")");
  m.agreement.agree({"create " + path_}, "");
  m.agreement.all_or_none([&] {
    if (m.root()) m.file = std::make_unique<FileWriter>(path_);  // stamps format and format_version
  });
  m.agreement.all_or_none([&] {  // the file exists now, on every rank's view of it
    if (options.collective_buffering) {
      TROUPE_MPI_CHECK(MPI_File_open(m.comm, path_.c_str(), MPI_MODE_WRONLY, MPI_INFO_NULL, &m.mpi_file));
      TROUPE_MPI_CHECK(MPI_File_set_errhandler(m.mpi_file, MPI_ERRORS_RETURN));
    } else {
      m.data = std::make_unique<detail::PosixFile>(path_, O_WRONLY);
    }
  });
}

ParallelWriter::~ParallelWriter() {
  auto lock = detail::h5_lock();
  impl_.reset();  // without the complete marker: readers will reject the file
}

int ParallelWriter::rank() const { return impl_->agreement.rank(); }
int ParallelWriter::size() const { return impl_->agreement.size(); }

void ParallelWriter::set_attribute(std::string_view group, std::string_view name, const AttrValue& value) {
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  std::string problem;
  if (!m.open) problem = "set_attribute after close()";
  try {
    detail::check_path(group, path_);
  } catch (const Error& e) {
    problem = e.what();
  }
  // The value's kind is part of the call: 42 and 42.0 are different attributes.
  m.agreement.agree({"set_attribute " + std::string(group) + " " + std::string(name) + " = " + to_string(value) +
                     " (kind " + std::to_string(value.index()) + ")"},
                    problem);
  m.agreement.all_or_none([&] {
    if (m.root()) m.file->set_attribute(group, name, value);
  });
}

void ParallelWriter::ensure_group(std::string_view group) {
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  std::string problem;
  if (!m.open) problem = "ensure_group after close()";
  try {
    detail::check_path(group, path_);
  } catch (const Error& e) {
    problem = e.what();
  }
  m.agreement.agree({"ensure_group " + std::string(group)}, problem);
  m.agreement.all_or_none([&] {
    if (m.root()) m.file->ensure_group(group);
  });
}

void ParallelWriter::write(const TensorSpec& spec, const Slice& slice) {
  write_all(std::span<const TensorSpec>(&spec, 1), std::span<const Slice>(&slice, 1));
}

std::vector<std::vector<int>> ParallelWriter::agree_on_slices(std::span<const TensorSpec> specs,
                                                              std::span<const Slice> slices, Layout& layout) {
  Impl& m = *impl_;
  const std::size_t n = specs.size();
  std::vector<std::string> call{"write " + std::to_string(n) + " tensors"};
  for (const TensorSpec& spec : specs) call.push_back("write " + describe(spec));
  std::string problem;
  layout.dtypes.assign(n, tensor::DType::f32);
  layout.numels.assign(n, 0);
  layout.mine.assign(n, Range{});
  try {
    TROUPE_CHECK(m.open, "write after close()");
    TROUPE_CHECK(slices.size() == n, "write: ", slices.size(), " slices for ", n,
                 " tensors (pass Slice{} for a tensor this rank holds none of)");
    for (std::size_t i = 0; i < n; ++i) {
      const TensorSpec& spec = specs[i];
      const std::string what = "tensor " + describe(spec);
      detail::check_path(spec.path, path_);
      layout.dtypes[i] = tensor::dtype_from_name(spec.dtype);
      for (std::int64_t d : spec.shape) TROUPE_CHECK(d >= 0, what, ": negative dimension");
      layout.numels[i] = tensor::shape_numel(spec.shape);
      const tensor::Tensor& data = slices[i].data;
      if (!data.defined()) continue;
      TROUPE_CHECK(data.dtype() == layout.dtypes[i], what, ": the slice is ", tensor::dtype_name(data.dtype()),
                   ", the tensor ", spec.dtype);
      layout.mine[i] = {slices[i].begin, slices[i].begin + data.numel()};
      TROUPE_CHECK(layout.mine[i].begin >= 0 && layout.mine[i].end <= layout.numels[i], what, ": slice [",
                   layout.mine[i].begin, ", ", layout.mine[i].end, ") is outside the tensor's ", layout.numels[i],
                   " elements");
    }
  } catch (const Error& e) {
    problem = e.what();
  }
  std::vector<std::vector<Range>> ranges = m.agreement.agree(call, problem, layout.mine);
  std::vector<std::vector<int>> chains(n);
  for (std::size_t i = 0; i < n; ++i)
    chains[i] = check_tiling(ranges[i], layout.numels[i], "tensor " + describe(specs[i]), m.agreement);
  return chains;
}

void ParallelWriter::create_datasets(std::span<const TensorSpec> specs, Layout& layout) {
  Impl& m = *impl_;
  const std::size_t n = specs.size();
  layout.offsets.assign(n, 0);
  m.agreement.all_or_none([&] {
    if (!m.root()) return;
    for (std::size_t i = 0; i < n; ++i)
      layout.offsets[i] = m.file->create_dataset(specs[i].path, layout.dtypes[i], specs[i].shape);
  });
  TROUPE_MPI_CHECK(MPI_Bcast(layout.offsets.data(), static_cast<int>(n), MPI_UINT64_T, 0, m.comm));
}

std::vector<std::uint64_t> ParallelWriter::chain_checksums(std::span<const Slice> slices,
                                                           const std::vector<std::vector<int>>& chains) {
  Impl& m = *impl_;
  const std::size_t n = chains.size();
  std::vector<std::uint64_t> digests(n, 0);
  std::exception_ptr failure;
  std::vector<Xxh64::State> outgoing(n);  // alive until their sends complete
  std::vector<MPI_Request> sends;
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<int>& chain = chains[i];
    if (chain.empty()) {
      digests[i] = xxh64(nullptr, 0);  // the same on every rank: OR-ing leaves it
      continue;
    }
    auto at = std::find(chain.begin(), chain.end(), rank());
    if (at == chain.end()) continue;
    Xxh64 hash;
    if (at != chain.begin()) {
      Xxh64::State state;
      TROUPE_MPI_CHECK(
          MPI_Recv(&state, static_cast<int>(sizeof state), MPI_BYTE, *(at - 1), kHashTag, m.comm, MPI_STATUS_IGNORE));
      hash = Xxh64(state);
    }
    try {  // (a failed device copy must not leave the chain waiting: the state goes on)
      const tensor::Tensor bytes = on_host(slices[i]);
      hash.update(bytes.raw_data(), bytes.nbytes());
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    if (at + 1 == chain.end()) {
      digests[i] = hash.digest();
      continue;
    }
    outgoing[i] = hash.state();
    sends.emplace_back();
    TROUPE_MPI_CHECK(MPI_Isend(&outgoing[i], static_cast<int>(sizeof(Xxh64::State)), MPI_BYTE, *(at + 1), kHashTag,
                               m.comm, &sends.back()));
  }
  TROUPE_MPI_CHECK(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE));
  TROUPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, digests.data(), static_cast<int>(n), MPI_UINT64_T, MPI_BOR, m.comm));
  m.agreement.settle(failure);
  return digests;
}

void ParallelWriter::write_bytes(std::span<const TensorSpec> specs, std::span<const Slice> slices, const Layout& layout,
                                 const std::function<void(std::size_t)>& written) {
  Impl& m = *impl_;
  const std::size_t n = specs.size();
  auto start_of = [&](std::size_t i) {
    return static_cast<std::int64_t>(layout.offsets[i]) +
           layout.mine[i].begin * static_cast<std::int64_t>(tensor::element_size(layout.dtypes[i]));
  };
  auto have = [&](std::size_t i) { return layout.mine[i].end > layout.mine[i].begin; };
  if (m.data) {
    m.agreement.all_or_none([&] {
      for (std::size_t i = 0; i < n; ++i) {
        if (have(i)) {
          const tensor::Tensor bytes = on_host(slices[i]);
          m.data->write_at(start_of(i), bytes.raw_data(), bytes.nbytes());
          bytes_written_ += bytes.nbytes();
        }
        if (written) written(i);
      }
    });
    return;
  }
  // Collective buffering: one MPI_File_write_at_all per tensor and round of at most
  // kRound bytes a rank (MPI counts are ints); a rank with nothing left writes nothing.
  constexpr std::size_t kRound = std::size_t{1} << 30;
  for (std::size_t i = 0; i < n; ++i) {
    m.agreement.all_or_none([&] {
      // A failed device copy must not leave the other ranks in the collective calls:
      // this rank takes part with nothing to write, then throws.
      tensor::Tensor bytes;
      std::exception_ptr copy_failed;
      try {
        if (have(i)) bytes = on_host(slices[i]);
      } catch (...) {
        copy_failed = std::current_exception();
      }
      const std::size_t total = bytes.defined() ? bytes.nbytes() : 0;
      std::uint64_t rounds = (total + kRound - 1) / kRound;
      TROUPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &rounds, 1, MPI_UINT64_T, MPI_MAX, m.comm));
      const auto* p = total ? static_cast<const char*>(bytes.raw_data()) : nullptr;
      int status = MPI_SUCCESS;
      for (std::uint64_t r = 0; r < rounds; ++r) {
        const std::size_t from = std::min(total, r * kRound), count = std::min(kRound, total - from);
        const int rc =
            MPI_File_write_at_all(m.mpi_file, static_cast<MPI_Offset>(start_of(i) + from), p ? p + from : nullptr,
                                  static_cast<int>(count), MPI_BYTE, MPI_STATUS_IGNORE);
        if (status == MPI_SUCCESS) status = rc;  // every rank makes every round's call
      }
      if (copy_failed) std::rethrow_exception(copy_failed);
      if (status != MPI_SUCCESS)
        TROUPE_THROW(StorageError, "checkpoint: cannot write ", path_, ":", specs[i].path, " (rank ", rank(),
                     ", MPI-IO: ", mpi_message(status), ")");
      bytes_written_ += total;
    });
    if (written) written(i);
  }
}

void ParallelWriter::write_all(std::span<const TensorSpec> specs, std::span<const Slice> slices,
                               const std::function<void(std::size_t)>& written) {
  auto lock = detail::h5_lock();
  Layout layout;
  const std::vector<std::vector<int>> chains = agree_on_slices(specs, slices, layout);
  create_datasets(specs, layout);
  const std::vector<std::uint64_t> digests = chain_checksums(slices, chains);
  write_bytes(specs, slices, layout, written);
  Impl& m = *impl_;
  m.agreement.all_or_none([&] {
    if (!m.root()) return;
    for (std::size_t i = 0; i < specs.size(); ++i) m.file->finish_dataset(specs[i].path, digests[i]);
  });
}

tensor::Tensor ParallelWriter::on_host(const Slice& slice) {
  return slice.data.device().is_cpu() ? slice.data : slice.data.to(tensor::Device::cpu());
}

void ParallelWriter::close() {
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  m.agreement.agree({"close"}, m.open ? "" : "close() called twice");
  m.open = false;
  // Every rank's bytes are on storage before rank 0 marks the file complete.
  m.agreement.all_or_none([&] {
    if (m.data) {
      m.data->sync();
      m.data->close();
      m.data.reset();
    }
  });
  if (m.mpi_file != MPI_FILE_NULL) {
    m.agreement.all_or_none([&] {  // collective calls, each made by every rank
      const int synced = MPI_File_sync(m.mpi_file);
      const int closed = MPI_File_close(&m.mpi_file);
      if (synced != MPI_SUCCESS || closed != MPI_SUCCESS)
        TROUPE_THROW(StorageError, "checkpoint: cannot sync ", path_, " (rank ", rank(),
                     ", MPI-IO: ", mpi_message(synced != MPI_SUCCESS ? synced : closed), ")");
    });
  }
  m.agreement.all_or_none([&] {
    if (!m.root()) return;
    m.file->close();  // "complete", then HDF5's flush and close, each write checked
    m.file.reset();
  });
}

}  // namespace troupe::checkpoint
