// The parallel writer: argument agreement, collective dataset creation, each rank's
// pwrite of its slices (or a collective hyperslab write), and the checksums chained
// across ranks (see the header).
#include "troupe/checkpoint/parallel_writer.hpp"

#include <fcntl.h>

#include <algorithm>
#include <functional>
#include <span>
#include <vector>

#include "durable_file.hpp"
#include "h5_call.hpp"
#include "h5_layout.hpp"
#include "h5_types.hpp"
#include "rank_agreement.hpp"
#include "troupe/checkpoint/error.hpp"
#include "troupe/checkpoint/format.hpp"
#include "troupe/checkpoint/xxhash64.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::checkpoint {

using detail::Handle;
using detail::h5_check;
using Range = detail::RankAgreement::Range;

namespace {

// Tag of the hash-state messages on the writer's own communicator.
constexpr int kHashTag = 1;

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  TROUPE_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  return dup;
}

std::string describe(const TensorSpec& spec) {
  std::string shape = "[";
  for (std::size_t i = 0; i < spec.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(spec.shape[i]);
  return spec.path + " " + spec.dtype + " " + shape + "]";
}

// Adds elements [b, e) (flat C order, b < e) of the sub-array at `prefix` (its leading
// coordinates) to the selection of `space`, as at most 2 * rank - 1 hyperslab blocks: a
// partial first row, the whole rows between, a partial last row, each partial row split
// the same way one dimension down. HDF5 visits a selection in C order whatever order its
// blocks were added in, so the selection's elements meet the 1-D memory buffer in order.
void select_range(hid_t space, const std::vector<hsize_t>& dims, std::vector<hsize_t>& prefix, hsize_t b,
                  hsize_t e, bool& first, const std::string& where) {
  const std::size_t k = prefix.size();
  hsize_t inner = 1;
  for (std::size_t d = k + 1; d < dims.size(); ++d) inner *= dims[d];
  auto block = [&](hsize_t from, hsize_t count) {
    std::vector<hsize_t> start(prefix), extent(k, 1);
    start.push_back(from);
    extent.push_back(count);
    for (std::size_t d = k + 1; d < dims.size(); ++d) start.push_back(0), extent.push_back(dims[d]);
    h5_check(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                                 extent.data(), nullptr),
             "H5Sselect_hyperslab " + where);
    first = false;
  };
  auto within = [&](hsize_t row, hsize_t from, hsize_t to) {
    prefix.push_back(row);
    select_range(space, dims, prefix, from, to, first, where);
    prefix.pop_back();
  };
  if (k + 1 == dims.size()) {
    block(b, e - b);
    return;
  }
  hsize_t first_row = b / inner, last_row = (e - 1) / inner;
  if (first_row == last_row && !(b % inner == 0 && e - b == inner)) {
    within(first_row, b - first_row * inner, e - first_row * inner);
    return;
  }
  hsize_t whole_from = first_row, whole_to = last_row + 1;  // rows covered entirely
  if (b % inner) {
    within(first_row, b % inner, inner);
    whole_from = first_row + 1;
  }
  if (e % inner) {
    within(last_row, 0, e - last_row * inner);
    whole_to = last_row;
  }
  if (whole_from < whole_to) block(whole_from, whole_to - whole_from);
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
    agreement.fail(detail::RankAgreement::kInvalidArgument,
                   what + ": elements [" + std::to_string(covered) + ", " + std::to_string(numel) +
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

struct ParallelWriter::Impl {
  explicit Impl(MPI_Comm parent) : comm(duplicate(parent)), agreement(comm) {}
  ~Impl() {
    file.reset();  // collective H5Fclose first: it still uses MPI
    dxpl.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm);
  }
  MPI_Comm comm;
  detail::RankAgreement agreement;
  Handle file;
  Handle group_plist;
  Handle dataset_plist;
  Handle dxpl;  // collective transfers (collective buffering only)
  std::unique_ptr<detail::GroupMaker> groups;
  // This rank's own descriptor of the file, for its raw data (see write()); null with
  // collective buffering, where MPI-IO carries the bytes.
  std::unique_ptr<detail::PosixFile> data;
};

ParallelWriter::ParallelWriter(std::string path, MPI_Comm comm, ParallelOptions options)
    : impl_(std::make_unique<Impl>(comm)), path_(std::move(path)) {
  auto lock = detail::h5_lock();
  detail::h5_init();
  Impl& m = *impl_;
  m.agreement.set_context("checkpoint " + path_ + " (parallel save, rank " + std::to_string(m.agreement.rank()) +
                          " of " + std::to_string(m.agreement.size()) + ")");
  m.agreement.agree({"create " + path_}, "");
  m.agreement.all_or_none([&] {
    Handle fapl(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"), H5Pclose);
    detail::set_checkpoint_file_access(fapl.get());
    h5_check(H5Pset_fapl_mpio(fapl.get(), m.comm, MPI_INFO_NULL), "H5Pset_fapl_mpio");
    Handle fcpl = detail::checkpoint_file_create_plist();
    m.file = Handle(h5_check(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()),
                             "checkpoint: cannot create " + path_ + " with MPI-IO"),
                    H5Fclose);
    m.group_plist = detail::checkpoint_group_create_plist();
    m.dataset_plist = detail::checkpoint_dataset_create_plist();
    m.groups = std::make_unique<detail::GroupMaker>(path_);
    if (options.collective_buffering) {
      m.dxpl = Handle(h5_check(H5Pcreate(H5P_DATASET_XFER), "H5Pcreate"), H5Pclose);
      h5_check(H5Pset_dxpl_mpio(m.dxpl.get(), H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");
      h5_check(H5Pset_dxpl_mpio_collective_opt(m.dxpl.get(), H5FD_MPIO_COLLECTIVE_IO),
               "H5Pset_dxpl_mpio_collective_opt");
    } else {
      m.data = std::make_unique<detail::PosixFile>(path_, O_WRONLY);
    }
  });
  set_attribute("/", kAttrFormat, std::string(kFormatName));
  set_attribute("/", kAttrFormatVersion, std::string(kFormatVersion));
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
  if (!m.file.valid()) problem = "set_attribute after close()";
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
    m.groups->ensure(m.file.get(), m.group_plist.get(), group);
    std::string g(group), where = path_ + ":" + g;
    Handle object(h5_check(H5Oopen(m.file.get(), g.c_str(), H5P_DEFAULT), "H5Oopen " + where), H5Oclose);
    detail::write_attribute(object.get(), name, value, where);
  });
}

void ParallelWriter::ensure_group(std::string_view group) {
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  std::string problem;
  if (!m.file.valid()) problem = "ensure_group after close()";
  try {
    detail::check_path(group, path_);
  } catch (const Error& e) {
    problem = e.what();
  }
  m.agreement.agree({"ensure_group " + std::string(group)}, problem);
  m.agreement.all_or_none([&] { m.groups->ensure(m.file.get(), m.group_plist.get(), group); });
}

void ParallelWriter::write(const TensorSpec& spec, const Slice& slice) {
  write_all(std::span<const TensorSpec>(&spec, 1), std::span<const Slice>(&slice, 1));
}

void ParallelWriter::write_all(std::span<const TensorSpec> specs, std::span<const Slice> slices,
                               const std::function<void(std::size_t)>& written) {
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  const std::size_t n = specs.size();

  // 1. This rank's own arguments, then agreement with every other rank, for all the
  //    tensors at once.
  std::vector<std::string> call{"write " + std::to_string(n) + " tensors"};
  for (const TensorSpec& spec : specs) call.push_back("write " + describe(spec));
  std::string problem;
  std::vector<tensor::DType> dtypes(n, tensor::DType::f32);
  std::vector<std::int64_t> numels(n, 0);
  std::vector<Range> mine(n);
  try {
    TROUPE_CHECK(m.file.valid(), "write after close()");
    TROUPE_CHECK(slices.size() == n, "write: ", slices.size(), " slices for ", n,
                 " tensors (pass Slice{} for a tensor this rank holds none of)");
    for (std::size_t i = 0; i < n; ++i) {
      const TensorSpec& spec = specs[i];
      const std::string what = "tensor " + describe(spec);
      detail::check_path(spec.path, path_);
      dtypes[i] = tensor::dtype_from_name(spec.dtype);
      for (std::int64_t d : spec.shape) TROUPE_CHECK(d >= 0, what, ": negative dimension");
      numels[i] = tensor::shape_numel(spec.shape);
      const tensor::Tensor& data = slices[i].data;
      if (!data.defined()) continue;
      TROUPE_CHECK(data.dtype() == dtypes[i], what, ": the slice is ", tensor::dtype_name(data.dtype()),
                   ", the tensor ", spec.dtype);
      mine[i] = {slices[i].begin, slices[i].begin + data.numel()};
      TROUPE_CHECK(mine[i].begin >= 0 && mine[i].end <= numels[i], what, ": slice [", mine[i].begin, ", ",
                   mine[i].end, ") is outside the tensor's ", numels[i], " elements");
    }
  } catch (const Error& e) {
    problem = e.what();
  }
  std::vector<std::vector<Range>> ranges = m.agreement.agree(call, problem, mine);
  std::vector<std::vector<int>> chains(n);
  for (std::size_t i = 0; i < n; ++i)
    chains[i] = check_tiling(ranges[i], numels[i], "tensor " + describe(specs[i]), m.agreement);
  auto have = [&](std::size_t i) { return mine[i].end > mine[i].begin; };
  auto host = [&](std::size_t i) {
    const tensor::Tensor& data = slices[i].data;
    return data.device().is_cpu() ? data : data.to(tensor::Device::cpu());
  };
  auto where = [&](std::size_t i) { return path_ + ":" + specs[i].path; };

  // 2. The datasets, their bytes allocated at once (parallel HDF5 always does) and never
  //    filled, and their dtype attributes: metadata, so every rank makes the calls.
  std::vector<Handle> dsets(n);
  m.agreement.all_or_none([&] {
    for (std::size_t i = 0; i < n; ++i) {
      m.groups->ensure(m.file.get(), m.group_plist.get(), detail::parent_of(specs[i].path));
      Handle space = detail::dataspace_of(specs[i].shape, where(i));
      dsets[i] = Handle(h5_check(H5Dcreate2(m.file.get(), specs[i].path.c_str(), detail::h5_type_of(dtypes[i]),
                                            space.get(), H5P_DEFAULT, m.dataset_plist.get(), H5P_DEFAULT),
                                 "checkpoint: cannot create dataset " + where(i)),
                        H5Dclose);
      detail::write_attribute(dsets[i].get(), kAttrDType, specs[i].dtype, where(i));
    }
  });

  // 3. The checksums. A dataset's XXH64 covers all its bytes, which no rank has: each
  //    tensor's chain of slice holders (in order of offset) passes the hash state along.
  //    Every rank takes the tensors in order and only its predecessor's state can hold
  //    it up, so the chains run as a pipeline; the last holder of each tensor has its
  //    digest, and one allreduce tells every rank all of them.
  std::vector<std::uint64_t> digests(n, 0);
  {
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
        TROUPE_MPI_CHECK(MPI_Recv(&state, static_cast<int>(sizeof state), MPI_BYTE, *(at - 1), kHashTag, m.comm,
                                  MPI_STATUS_IGNORE));
        hash = Xxh64(state);
      }
      try {  // (a failed device copy must not leave the chain waiting: the state goes on)
        const tensor::Tensor bytes = host(i);
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
      TROUPE_MPI_CHECK(MPI_Isend(&outgoing[i], static_cast<int>(sizeof(Xxh64::State)), MPI_BYTE, *(at + 1),
                                 kHashTag, m.comm, &sends.back()));
    }
    TROUPE_MPI_CHECK(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE));
    TROUPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, digests.data(), static_cast<int>(n), MPI_UINT64_T, MPI_BOR, m.comm));
    m.agreement.settle(failure);
  }

  // 4. The bytes. Without collective buffering each rank pwrite()s its slices at their
  //    datasets' addresses (contiguous, allocated, never filled: HDF5 writes nothing
  //    there itself), with no message between ranks until all are written. H5Dwrite
  //    over MPI-IO would be a collective per tensor (ompio's MPI_File_set_view is an
  //    allreduce), and ranks waiting in one spin on the cores the others write with.
  //    With collective buffering: one collective hyperslab write per tensor through
  //    MPI-IO's aggregators. Memory type == file type, so HDF5 converts nothing.
  if (m.data) {
    m.agreement.all_or_none([&] {
      for (std::size_t i = 0; i < n; ++i) {
        if (have(i)) {
          const haddr_t address = H5Dget_offset(dsets[i].get());
          if (address == HADDR_UNDEF)
            detail::h5_fail(detail::Failure::io, "checkpoint: " + where(i) + " has no contiguous storage to write to");
          const tensor::Tensor bytes = host(i);
          m.data->write_at(static_cast<std::int64_t>(address) +
                               mine[i].begin * static_cast<std::int64_t>(tensor::element_size(dtypes[i])),
                           bytes.raw_data(), bytes.nbytes());
          bytes_written_ += bytes.nbytes();
        }
        if (written) written(i);
      }
    });
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      if (numels[i] > 0) m.agreement.all_or_none([&] {  // an empty tensor has no bytes (nor address)
        Handle file_space(h5_check(H5Dget_space(dsets[i].get()), "H5Dget_space " + where(i)), H5Sclose);
        hsize_t count = have(i) ? static_cast<hsize_t>(mine[i].end - mine[i].begin) : 1;
        Handle memory_space(h5_check(H5Screate_simple(1, &count, nullptr), "H5Screate_simple " + where(i)),
                            H5Sclose);
        if (!have(i)) {
          // A rank without a slice still takes part in the collective write, selecting nothing.
          h5_check(H5Sselect_none(file_space.get()), "H5Sselect_none " + where(i));
          h5_check(H5Sselect_none(memory_space.get()), "H5Sselect_none " + where(i));
        } else if (!specs[i].shape.empty()) {
          std::vector<hsize_t> dims(specs[i].shape.begin(), specs[i].shape.end()), prefix;
          bool first = true;
          select_range(file_space.get(), dims, prefix, static_cast<hsize_t>(mine[i].begin),
                       static_cast<hsize_t>(mine[i].end), first, where(i));
        }  // else: the one element of a 0-dim tensor, selected whole
        static const char nothing = 0;
        const tensor::Tensor bytes = have(i) ? host(i) : tensor::Tensor();
        const void* data = have(i) ? bytes.raw_data() : &nothing;
        h5_check(H5Dwrite(dsets[i].get(), detail::h5_type_of(dtypes[i]), memory_space.get(), file_space.get(),
                          m.dxpl.get(), data),
                 "checkpoint: cannot write " + where(i) + " (rank " + std::to_string(rank()) + "'s slice [" +
                     std::to_string(mine[i].begin) + ", " + std::to_string(mine[i].end) + "))");
        if (have(i)) bytes_written_ += bytes.nbytes();
      });
      if (written) written(i);
    }
  }

  // 5. The checksum attributes.
  m.agreement.all_or_none([&] {
    for (std::size_t i = 0; i < n; ++i) detail::write_u64_attribute(dsets[i].get(), kAttrChecksum, digests[i], where(i));
  });
}

void ParallelWriter::close() {
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  m.agreement.agree({"close"}, m.file.valid() ? "" : "close() called twice");
  set_attribute("/", kAttrComplete, std::int64_t{1});
  m.agreement.all_or_none([&] {
    m.dataset_plist.reset();
    m.group_plist.reset();
    if (m.data) {  // this rank's raw data first, then HDF5's own writes
      m.data->sync();
      m.data->close();
      m.data.reset();
    }
    // In the MPI-IO driver a flush is MPI_File_sync on every rank (a close is not).
    h5_check(H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL), "checkpoint: cannot flush " + path_);
    if (m.file.reset() < 0) detail::h5_fail(detail::Failure::io, "checkpoint: cannot close " + path_);
  });
}

}  // namespace troupe::checkpoint
