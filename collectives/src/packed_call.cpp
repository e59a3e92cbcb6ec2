#include "packed_call.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "reduce_kernels.hpp"
#include "signature_check.hpp"
#include "troupe/collectives/collective_error.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::collectives::detail {

namespace {

using K = CollectiveKind;

// s, then -s: a field-wise minimum of headers leaves min(s) and -max(s).
struct Header {
  std::int64_t low[kSignatureFields];
  std::int64_t negated_high[kSignatureFields];
};
constexpr std::size_t kHeaderBytes = sizeof(Header);

Header header_of(const Collective& c) {
  const Signature s = signature_of(c);
  Header h{};
  for (int i = 0; i < kSignatureFields; ++i) {
    h.low[i] = s[static_cast<std::size_t>(i)];
    h.negated_high[i] = -s[static_cast<std::size_t>(i)];
  }
  return h;
}

bool uniform(const Header& h) {
  for (int i = 0; i < kSignatureFields; ++i)
    if (h.low[i] != -h.negated_high[i]) return false;
  return true;
}

Signature signature_in(const Header& h) {
  Signature s{};
  for (int i = 0; i < kSignatureFields; ++i) s[static_cast<std::size_t>(i)] = h.low[i];
  return s;
}

// MPI calls it with (in, inout): inout = in combined with inout, record by record.
void combine_records(void* in, void* inout, int* len, MPI_Datatype* type) {
  int record = 0;
  MPI_Type_size(*type, &record);
  for (int k = 0; k < *len; ++k) {
    auto* a = static_cast<std::byte*>(in) + static_cast<std::size_t>(k) * static_cast<std::size_t>(record);
    auto* b = static_cast<std::byte*>(inout) + static_cast<std::size_t>(k) * static_cast<std::size_t>(record);
    Header ha, hb;
    std::memcpy(&ha, a, kHeaderBytes);
    std::memcpy(&hb, b, kHeaderBytes);
    const bool agree = uniform(ha) && uniform(hb) && std::memcmp(ha.low, hb.low, sizeof ha.low) == 0;
    for (int i = 0; i < kSignatureFields; ++i) {
      hb.low[i] = std::min(ha.low[i], hb.low[i]);
      hb.negated_high[i] = std::min(ha.negated_high[i], hb.negated_high[i]);
    }
    std::memcpy(b, &hb, kHeaderBytes);
    if (!agree) continue;  // the result is a mismatch: its payload is never read
    const auto dtype = static_cast<DType>(ha.low[3]);
    const auto count = static_cast<std::size_t>(ha.low[2]);
    if (kHeaderBytes + count * element_size(dtype) != static_cast<std::size_t>(record)) continue;
    const auto op = static_cast<ReduceOp>(ha.low[4]);
    reduce(op == ReduceOp::avg ? ReduceOp::sum : op, dtype, b + kHeaderBytes, a + kHeaderBytes, b + kHeaderBytes,
           count);
  }
}

MPI_Op combine_op() {
  static MPI_Op op = [] {
    MPI_Op created = MPI_OP_NULL;
    TROUPE_MPI_CHECK(MPI_Op_create(&combine_records, 1, &created));
    return created;
  }();
  return op;
}

// A committed contiguous datatype of `bytes`, one per size, kept for the process (as
// MPI's own ops are); creating one per call would cost more than the call.
MPI_Datatype record_type(std::size_t bytes) {
  thread_local std::size_t last_bytes = 0;  // a loop of one size skips the lock
  thread_local MPI_Datatype last_type = MPI_DATATYPE_NULL;
  if (bytes == last_bytes && last_type != MPI_DATATYPE_NULL) return last_type;
  static std::mutex mutex;
  static std::map<std::size_t, MPI_Datatype> types;
  std::lock_guard lock(mutex);
  auto [it, fresh] = types.try_emplace(bytes, MPI_DATATYPE_NULL);
  if (fresh) {
    TROUPE_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &it->second));
    TROUPE_MPI_CHECK(MPI_Type_commit(&it->second));
  }
  last_bytes = bytes;
  last_type = it->second;
  return it->second;
}

// After an allreduce or a barrier: every rank holds the same minima.
void check_reduced(const Header& h, const Collective& c, const MpiSite& site, MPI_Comm check_comm,
                   std::chrono::milliseconds timeout) {
  if (uniform(h)) return;
  verify_signature(check_comm, c, site.rank, site.size, timeout);  // names the ranks; every rank comes
  TROUPE_THROW(CollectiveMismatch, "collective mismatch at ", c.describe(), " (seen on rank ", site.rank, " of ",
               site.size, "): the ranks' signatures differ");
}

}  // namespace

bool can_pack(const Collective& c) {
  const bool kind = c.kind == K::allreduce || c.kind == K::reduce_scatter || c.kind == K::allgather ||
                    c.kind == K::broadcast || c.kind == K::barrier;
  return kind && std::max(c.input.nbytes(), c.output.nbytes()) <= kPackedCallBytes;
}

void run_packed(const Collective& c, const MpiSite& site, MPI_Comm check_comm, std::chrono::milliseconds timeout) {
  thread_local std::vector<std::byte> scratch;  // records of at most a few KB, reused
  const Header mine = header_of(c);
  const std::size_t payload = c.count * element_size(c.dtype);
  const std::size_t record = kHeaderBytes + payload;
  switch (c.kind) {
    case K::barrier: {
      Header h = mine;
      TROUPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &h, 2 * kSignatureFields, MPI_INT64_T, MPI_MIN, site.comm));
      check_reduced(h, c, site, check_comm, timeout);
      return;
    }
    case K::allreduce: {
      scratch.resize(record);
      std::memcpy(scratch.data(), &mine, kHeaderBytes);
      if (payload) std::memcpy(scratch.data() + kHeaderBytes, c.in_place ? c.output.data : c.input.data, payload);
      TROUPE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, scratch.data(), 1, record_type(record), combine_op(), site.comm));
      Header h;
      std::memcpy(&h, scratch.data(), kHeaderBytes);
      check_reduced(h, c, site, check_comm, timeout);
      if (payload) std::memcpy(c.output.data, scratch.data() + kHeaderBytes, payload);
      if (c.op == ReduceOp::avg) scale(c.dtype, c.output.data, c.count, 1.0 / site.size);
      return;
    }
    case K::reduce_scatter: {
      // One record per destination rank, each [ header | that rank's block ]: reduced
      // and scattered, every rank gets the headers' minima as an allreduce does.
      const auto n = static_cast<std::size_t>(site.size);
      scratch.resize(record * (n + 1));
      const auto* in = static_cast<const std::byte*>(c.input.data);
      for (std::size_t r = 0; r < n; ++r) {
        std::memcpy(scratch.data() + r * record, &mine, kHeaderBytes);
        if (payload) std::memcpy(scratch.data() + r * record + kHeaderBytes, in + r * payload, payload);
      }
      std::byte* own = scratch.data() + record * n;
      TROUPE_MPI_CHECK(
          MPI_Reduce_scatter_block(scratch.data(), own, 1, record_type(record), combine_op(), site.comm));
      Header h;
      std::memcpy(&h, own, kHeaderBytes);
      check_reduced(h, c, site, check_comm, timeout);
      if (payload) std::memcpy(c.output.data, own + kHeaderBytes, payload);
      if (c.op == ReduceOp::avg) scale(c.dtype, c.output.data, c.count, 1.0 / site.size);
      return;
    }
    case K::broadcast: {
      scratch.resize(record);
      const bool root = site.rank == c.root;
      if (root) {
        std::memcpy(scratch.data(), &mine, kHeaderBytes);
        if (payload) std::memcpy(scratch.data() + kHeaderBytes, c.input.data, payload);
      }
      TROUPE_MPI_CHECK(MPI_Bcast(scratch.data(), 1, record_type(record), c.root, site.comm));
      Header h;
      std::memcpy(&h, scratch.data(), kHeaderBytes);
      if (!root && std::memcmp(h.low, mine.low, sizeof h.low) != 0)
        throw_mismatch(c, site.rank, site.size, {{signature_in(h), {c.root}}, {signature_of(c), {site.rank}}});
      if (payload && (!root || c.output.data != c.input.data))
        std::memcpy(c.output.data, scratch.data() + kHeaderBytes, payload);
      return;
    }
    case K::allgather: {
      const auto n = static_cast<std::size_t>(site.size);
      scratch.resize(record * (n + 1));
      std::byte* own = scratch.data() + record * n;  // the input may be a slice of the output
      std::memcpy(own, &mine, kHeaderBytes);
      if (payload) std::memcpy(own + kHeaderBytes, c.input.data, payload);
      const MPI_Datatype type = record_type(record);
      TROUPE_MPI_CHECK(MPI_Allgather(own, 1, type, scratch.data(), 1, type, site.comm));
      // Compared in place; the map that names the ranks is built only for a mismatch
      // (its allocations were a few percent of a small call over TCP).
      bool agree = true;
      for (std::size_t r = 0; r < n && agree; ++r)
        agree = std::memcmp(scratch.data() + r * record, mine.low, sizeof mine.low) == 0;
      if (!agree) {
        std::map<Signature, std::vector<int>> ranks_by_call;
        for (std::size_t r = 0; r < n; ++r) {
          Header h;
          std::memcpy(&h, scratch.data() + r * record, kHeaderBytes);
          ranks_by_call[signature_in(h)].push_back(static_cast<int>(r));
        }
        throw_mismatch(c, site.rank, site.size, ranks_by_call);
      }
      auto* out = static_cast<std::byte*>(c.output.data);
      for (std::size_t r = 0; r < n && payload; ++r)
        std::memcpy(out + r * payload, scratch.data() + r * record + kHeaderBytes, payload);
      return;
    }
    default:
      TROUPE_THROW(InvalidArgument, c.describe(), ": not a call that travels packed");
  }
}

}  // namespace troupe::collectives::detail
