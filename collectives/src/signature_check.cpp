#include "signature_check.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "troupe/collectives/collective_error.hpp"
#include "troupe/collectives/options.hpp"
#include "troupe/keep_until_exit.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::collectives::detail {

namespace {

constexpr int kFields = 6;
using Signature = std::array<std::int64_t, kFields>;

Signature signature_of(const Collective& c) {
  return {static_cast<std::int64_t>(c.sequence), static_cast<std::int64_t>(c.kind),
          static_cast<std::int64_t>(c.count),    static_cast<std::int64_t>(c.dtype),
          c.has_op() ? static_cast<std::int64_t>(c.op) : -1, c.has_root() ? c.root : -1};
}

std::string describe(const Signature& s) {
  Collective c;
  c.sequence = static_cast<std::uint64_t>(s[0]);
  c.kind = static_cast<CollectiveKind>(s[1]);
  c.count = static_cast<std::size_t>(s[2]);
  c.dtype = static_cast<DType>(s[3]);
  if (s[4] >= 0) c.op = static_cast<ReduceOp>(s[4]);
  if (s[5] >= 0) c.root = static_cast<int>(s[5]);
  return c.describe();
}

}  // namespace

void verify_signature(MPI_Comm comm, const Collective& collective, int rank, int size,
                      std::chrono::milliseconds timeout) {
  // Heap-allocated: on a timeout MPI may still write here, so it is then leaked.
  auto mine = std::make_unique<Signature>(signature_of(collective));
  auto all = std::make_unique<std::vector<Signature>>(static_cast<std::size_t>(size));
  MPI_Request request = MPI_REQUEST_NULL;
  TROUPE_MPI_CHECK(MPI_Iallgather(mine->data(), kFields, MPI_INT64_T, all->data(), kFields, MPI_INT64_T, comm, &request));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int flag = 0, polls = 0; !flag; ++polls) {
    TROUPE_MPI_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
    if (!flag && timeout != kNoTimeout && (polls & 7) == 7 && std::chrono::steady_clock::now() >= deadline) {
      troupe::detail::keep_until_exit(mine.release());
      troupe::detail::keep_until_exit(all.release());
      TROUPE_THROW(TimeoutError, "debug check of ", collective.describe(), " on rank ", rank,
                   ": not every rank reached it within ", timeout.count(), " ms");
    }
  }
  std::map<Signature, std::vector<int>> ranks_by_call;
  for (int r = 0; r < size; ++r) ranks_by_call[(*all)[r]].push_back(r);
  if (ranks_by_call.size() == 1) return;
  std::string calls;
  for (const auto& [sig, ranks] : ranks_by_call) {
    calls += ranks.size() == 1 ? "\n  rank " : "\n  ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) calls += troupe::detail::concat(i ? "," : "", ranks[i]);
    calls += ": " + describe(sig);
  }
  TROUPE_THROW(CollectiveMismatch, "collective mismatch at sequence #", collective.sequence, " (seen on rank ", rank,
               " of ", size, "); the ranks issued different calls:", calls);
}

}  // namespace troupe::collectives::detail
