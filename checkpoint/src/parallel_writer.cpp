// The parallel writer: argument agreement, collective dataset creation, the hyperslab
// write of each rank's slice, and the checksum chained across ranks (see the header).
#include "troupe/checkpoint/parallel_writer.hpp"

#include <algorithm>
#include <vector>

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
  Handle dxpl;  // collective transfers
  std::unique_ptr<detail::GroupMaker> groups;
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
    m.dxpl = Handle(h5_check(H5Pcreate(H5P_DATASET_XFER), "H5Pcreate"), H5Pclose);
    h5_check(H5Pset_dxpl_mpio(m.dxpl.get(), H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");
    h5_check(H5Pset_dxpl_mpio_collective_opt(m.dxpl.get(), options.collective_buffering ? H5FD_MPIO_COLLECTIVE_IO
                                                                                       : H5FD_MPIO_INDIVIDUAL_IO),
             "H5Pset_dxpl_mpio_collective_opt");
    m.groups = std::make_unique<detail::GroupMaker>(path_);
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
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  const std::string where = path_ + ":" + spec.path;
  const std::string what = "tensor " + describe(spec);

  // 1. This rank's own arguments, then agreement with every other rank.
  std::string problem;
  tensor::DType dtype = tensor::DType::f32;
  std::int64_t numel = 0;
  tensor::Tensor host;
  Range mine;
  try {
    TROUPE_CHECK(m.file.valid(), "write after close()");
    detail::check_path(spec.path, path_);
    dtype = tensor::dtype_from_name(spec.dtype);
    for (std::int64_t d : spec.shape) TROUPE_CHECK(d >= 0, what, ": negative dimension");
    numel = tensor::shape_numel(spec.shape);
    if (slice.data.defined()) {
      TROUPE_CHECK(slice.data.dtype() == dtype, what, ": the slice is ", tensor::dtype_name(slice.data.dtype()),
                   ", the tensor ", spec.dtype);
      mine = {slice.begin, slice.begin + slice.data.numel()};
      TROUPE_CHECK(mine.begin >= 0 && mine.end <= numel, what, ": slice [", mine.begin, ", ", mine.end,
                   ") is outside the tensor's ", numel, " elements");
      host = slice.data.device().is_cpu() ? slice.data : slice.data.to(tensor::Device::cpu());
    }
  } catch (const Error& e) {
    problem = e.what();
  }
  std::vector<Range> ranges = m.agreement.agree({"write " + describe(spec)}, problem, mine);
  std::vector<int> chain = check_tiling(ranges, numel, what, m.agreement);

  // 2. The dataset, with its bytes allocated at once (parallel HDF5 always does) and
  //    never filled, and its dtype attribute: metadata, so every rank makes the calls.
  Handle dset;
  m.agreement.all_or_none([&] {
    m.groups->ensure(m.file.get(), m.group_plist.get(), detail::parent_of(spec.path));
    Handle space = detail::dataspace_of(spec.shape, where);
    dset = Handle(h5_check(H5Dcreate2(m.file.get(), spec.path.c_str(), detail::h5_type_of(dtype), space.get(),
                                      H5P_DEFAULT, m.dataset_plist.get(), H5P_DEFAULT),
                           "checkpoint: cannot create dataset " + where),
                  H5Dclose);
    detail::write_attribute(dset.get(), kAttrDType, spec.dtype, where);
  });

  // 3. Every rank's hyperslab in one collective write; memory type == file type, so
  //    HDF5 converts nothing. An empty tensor has no bytes (and no address) to write to.
  const bool have = mine.end > mine.begin;
  if (numel > 0) m.agreement.all_or_none([&] {
    Handle file_space(h5_check(H5Dget_space(dset.get()), "H5Dget_space " + where), H5Sclose);
    hsize_t count = have ? static_cast<hsize_t>(mine.end - mine.begin) : 1;
    Handle memory_space(h5_check(H5Screate_simple(1, &count, nullptr), "H5Screate_simple " + where), H5Sclose);
    if (!have) {
      // A rank without a slice still takes part in the collective write, selecting nothing.
      h5_check(H5Sselect_none(file_space.get()), "H5Sselect_none " + where);
      h5_check(H5Sselect_none(memory_space.get()), "H5Sselect_none " + where);
    } else if (!spec.shape.empty()) {
      std::vector<hsize_t> dims(spec.shape.begin(), spec.shape.end()), prefix;
      bool first = true;
      select_range(file_space.get(), dims, prefix, static_cast<hsize_t>(mine.begin), static_cast<hsize_t>(mine.end),
                   first, where);
    }  // else: the one element of a 0-dim tensor, selected whole
    static const char nothing = 0;
    const void* data = have ? host.raw_data() : &nothing;
    h5_check(H5Dwrite(dset.get(), detail::h5_type_of(dtype), memory_space.get(), file_space.get(), m.dxpl.get(), data),
             "checkpoint: cannot write " + where + " (rank " + std::to_string(rank()) + "'s slice [" +
                 std::to_string(mine.begin) + ", " + std::to_string(mine.end) + "))");
  });
  if (have) bytes_written_ += host.nbytes();

  // 4. The checksum, chained through the slices in order of offset (see the header).
  std::uint64_t digest = 0;
  if (chain.empty()) {
    digest = xxh64(nullptr, 0);
  } else {
    auto at = std::find(chain.begin(), chain.end(), rank());
    if (at != chain.end()) {
      Xxh64 hash;
      if (at != chain.begin()) {
        Xxh64::State state;
        TROUPE_MPI_CHECK(MPI_Recv(&state, static_cast<int>(sizeof state), MPI_BYTE, *(at - 1), kHashTag, m.comm, MPI_STATUS_IGNORE));
        hash = Xxh64(state);
      }
      hash.update(host.raw_data(), host.nbytes());
      if (at + 1 != chain.end())
        TROUPE_MPI_CHECK(MPI_Send(&hash.state(), static_cast<int>(sizeof(Xxh64::State)), MPI_BYTE, *(at + 1), kHashTag, m.comm));
      else
        digest = hash.digest();
    }
    TROUPE_MPI_CHECK(MPI_Bcast(&digest, 1, MPI_UINT64_T, chain.back(), m.comm));
  }
  m.agreement.all_or_none([&] { detail::write_u64_attribute(dset.get(), kAttrChecksum, digest, where); });
}

void ParallelWriter::close() {
  auto lock = detail::h5_lock();
  Impl& m = *impl_;
  m.agreement.agree({"close"}, m.file.valid() ? "" : "close() called twice");
  set_attribute("/", kAttrComplete, std::int64_t{1});
  m.agreement.all_or_none([&] {
    m.dataset_plist.reset();
    m.group_plist.reset();
    // In the MPI-IO driver a flush is MPI_File_sync on every rank (a close is not).
    h5_check(H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL), "checkpoint: cannot flush " + path_);
    if (m.file.reset() < 0) detail::h5_fail(detail::Failure::io, "checkpoint: cannot close " + path_);
  });
}

}  // namespace troupe::checkpoint
