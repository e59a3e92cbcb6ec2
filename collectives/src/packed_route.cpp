#include "packed_route.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "blocking_watchdog.hpp"
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
// The longest message of any packed call: a header and at most kPackedCallBytes of data
// (no message carries more than the call's larger buffer, which PackedRoute::supports bounds). Every
// receive is posted this long, so a peer's message is never truncated, whatever call
// the peer issued.
constexpr std::size_t kMessageBytes = kHeaderBytes + kPackedCallBytes;
// On the check communicator, whose only other traffic is collectives (which never
// match a point-to-point message).
constexpr int kTag = 0;

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

void merge(Header& into, const Header& from) {
  for (int i = 0; i < kSignatureFields; ++i) {
    into.low[i] = std::min(into.low[i], from.low[i]);
    into.negated_high[i] = std::min(into.negated_high[i], from.negated_high[i]);
  }
}

// ---- the exchange: allreduce, reduce_scatter, allgather, barrier ----
//
// Recursive doubling over the largest power of two p <= n: at step k each rank r < p
// swaps a message with r ^ 2^k, after which it holds what the 2^(k+1) ranks that agree
// with it above bit k contributed -- one message latency per step, as in MPI's own
// small allreduce. A rank p + i (i < n - p) first hands its part to rank i, which
// sends it the result at the end. Each message carries the headers merged so far, so
// every rank ends with every rank's. Every kind takes the same steps, and each receive
// is posted at kMessageBytes, so each rank finishes whatever its peers issued; a
// peer's data is used only while the headers agree, which is when its length is the
// expected one.
//
// The data is in units of blocks, one per rank, in the exchange's order: rank v < p,
// then rank v + p if it was folded into v. A message holds a contiguous range of them.
struct Blocks {
  int first = 0, last = 0;
};

struct Layout {
  int n, p;
  int before(int v) const { return v + std::min(v, n - p); }  // blocks of ranks 0..v-1 and those folded into them
  int block_of(int rank) const { return rank < p ? before(rank) : before(rank - p) + 1; }
};

int largest_power_of_two(int n) {
  int p = 1;
  while (2 * p <= n) p *= 2;
  return p;
}

// What a kind carries after the header (one struct per kind, as the Body of exchange):
//   message(b, h)          [h | what this rank holds of blocks b];
//   bytes(b)               the length of that data for a peer that issued this call;
//   take(b, data, result)  adds a peer's data for blocks b (result: the final one).

// allreduce, reduce_scatter (the whole input, of which each rank keeps its block; at
// most 4 KB), barrier (nothing): every message holds the partial reduction.
struct Reduction {
  std::vector<std::byte>& work;  // [header | partial]
  ReduceOp op;                   // never avg: its division comes after
  DType dtype;
  std::size_t count;
  std::size_t data_bytes;

  std::span<const std::byte> message(Blocks, const Header& h) {
    std::memcpy(work.data(), &h, kHeaderBytes);
    return {work.data(), kHeaderBytes + data_bytes};
  }
  std::size_t bytes(Blocks) const { return data_bytes; }
  void take(Blocks, const std::byte* data, bool result) {
    std::byte* partial = work.data() + kHeaderBytes;
    // a + b on one rank is b + a on its peer: both get the same bits.
    if (result)
      std::memcpy(partial, data, data_bytes);
    else if (count)
      reduce(op, dtype, partial, partial, data, count);
  }
};

// allgather: a message holds the blocks of the ranks it covers.
struct Gathering {
  std::vector<std::byte>& work;      // every rank's block, in the exchange's order
  std::vector<std::byte>& outgoing;  // [header | a range of them]
  std::size_t block;

  std::span<const std::byte> message(Blocks b, const Header& h) {
    std::memcpy(outgoing.data(), &h, kHeaderBytes);
    std::memcpy(outgoing.data() + kHeaderBytes, work.data() + b.first * block, bytes(b));
    return {outgoing.data(), kHeaderBytes + bytes(b)};
  }
  std::size_t bytes(Blocks b) const { return static_cast<std::size_t>(b.last - b.first) * block; }
  void take(Blocks b, const std::byte* data, bool) { std::memcpy(work.data() + b.first * block, data, bytes(b)); }
};

// One step with `peer`: sends this rank's message holding `send`, receives the peer's
// holding `receive` (either may be absent), and merges the peer's header into `h`. The
// peer's data is taken only while the headers agree: then its length is the expected one.
template <class Body>
void step(Body& body, Header& h, int peer, const Blocks* send, const Blocks* receive, bool result, MPI_Comm comm,
          std::byte* incoming) {
  MPI_Status status;
  if (send) {
    const std::span<const std::byte> m = body.message(*send, h);
    const int length = static_cast<int>(m.size());
    if (!receive) {
      TROUPE_MPI_CHECK(MPI_Send(m.data(), length, MPI_BYTE, peer, kTag, comm));
      return;
    }
    TROUPE_MPI_CHECK(MPI_Sendrecv(m.data(), length, MPI_BYTE, peer, kTag, incoming, static_cast<int>(kMessageBytes),
                                  MPI_BYTE, peer, kTag, comm, &status));
  } else {
    TROUPE_MPI_CHECK(MPI_Recv(incoming, static_cast<int>(kMessageBytes), MPI_BYTE, peer, kTag, comm, &status));
  }
  int got = 0;
  TROUPE_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &got));
  Header theirs;  // every packed message starts with one
  std::memcpy(&theirs, incoming, kHeaderBytes);
  merge(h, theirs);
  if (uniform(h) && static_cast<std::size_t>(got) == kHeaderBytes + body.bytes(*receive))
    body.take(*receive, incoming + kHeaderBytes, result);
}

// Runs the exchange on `comm`; `h` starts as this rank's header and ends as every rank's merged.
template <class Body>
void exchange(Body& body, Header& h, int rank, int n, MPI_Comm comm, std::byte* incoming) {
  const Layout at{n, largest_power_of_two(n)};
  const Blocks all{0, n};
  if (rank >= at.p) {  // folded into rank - p: hand over this rank's part, then receive the result
    const Blocks own{at.block_of(rank), at.block_of(rank) + 1};
    step(body, h, rank - at.p, &own, nullptr, false, comm, incoming);
    step(body, h, rank - at.p, nullptr, &all, true, comm, incoming);
    return;
  }
  const bool hosts = rank < n - at.p;
  if (hosts) {
    const Blocks folded{at.before(rank) + 1, at.before(rank) + 2};
    step(body, h, rank + at.p, nullptr, &folded, false, comm, incoming);
  }
  for (int mask = 1; mask < at.p; mask <<= 1) {
    const int mine = rank & ~(mask - 1), theirs = mine ^ mask;
    const Blocks send{at.before(mine), at.before(mine + mask)}, receive{at.before(theirs), at.before(theirs + mask)};
    step(body, h, rank ^ mask, &send, &receive, false, comm, incoming);
  }
  if (hosts) step(body, h, rank + at.p, &all, nullptr, false, comm, incoming);
}

// After an exchange: every rank holds the same merged header.
void check_merged(const Header& h, const Collective& c, const MpiSite& site, MPI_Comm check_comm,
                  std::chrono::milliseconds timeout) {
  if (uniform(h)) return;
  verify_signature(check_comm, c, site.rank, site.size, timeout);  // names the ranks; every rank comes
  TROUPE_THROW(CollectiveMismatch, "collective mismatch at ", c.describe(), " (seen on rank ", site.rank, " of ",
               site.size, "): the ranks' signatures differ");
}

struct Scratch {
  std::vector<std::byte> work, outgoing, incoming = std::vector<std::byte>(kMessageBytes);
};

void reduce_packed(const Collective& c, const MpiSite& site, MPI_Comm check_comm, std::chrono::milliseconds timeout,
                   Scratch& s) {
  // A reduce_scatter reduces its whole input (at most 4 KB), of which each rank keeps
  // its block: the same steps as an allreduce, so either meets the other's messages.
  const std::size_t count = c.kind == K::reduce_scatter ? c.count * static_cast<std::size_t>(site.size)
                            : c.kind == K::barrier      ? 0
                                                        : c.count;
  const std::size_t es = element_size(c.dtype), data_bytes = count * es;
  s.work.resize(kHeaderBytes + data_bytes);
  const void* in = c.kind == K::allreduce && c.in_place ? c.output.data : c.input.data;
  if (data_bytes) std::memcpy(s.work.data() + kHeaderBytes, in, data_bytes);
  Reduction body{s.work, c.op == ReduceOp::avg ? ReduceOp::sum : c.op, c.dtype, count, data_bytes};
  Header h = header_of(c);
  exchange(body, h, site.rank, site.size, check_comm, s.incoming.data());
  check_merged(h, c, site, check_comm, timeout);
  if (c.kind == K::barrier) return;
  const std::size_t own = c.kind == K::reduce_scatter ? static_cast<std::size_t>(site.rank) * c.count * es : 0;
  if (c.count) std::memcpy(c.output.data, s.work.data() + kHeaderBytes + own, c.count * es);
  if (c.op == ReduceOp::avg) scale(c.dtype, c.output.data, c.count, 1.0 / site.size);
}

void allgather_packed(const Collective& c, const MpiSite& site, MPI_Comm check_comm, std::chrono::milliseconds timeout,
                      Scratch& s) {
  const std::size_t block = c.count * element_size(c.dtype);
  const Layout at{site.size, largest_power_of_two(site.size)};
  s.work.resize(block * static_cast<std::size_t>(site.size));
  s.outgoing.resize(kMessageBytes);
  // The input may be a slice of the output: it is copied in before anything is written out.
  if (block) std::memcpy(s.work.data() + static_cast<std::size_t>(at.block_of(site.rank)) * block, c.input.data, block);
  Gathering body{s.work, s.outgoing, block};
  Header h = header_of(c);
  exchange(body, h, site.rank, site.size, check_comm, s.incoming.data());
  check_merged(h, c, site, check_comm, timeout);
  auto* out = static_cast<std::byte*>(c.output.data);
  for (int r = 0; r < site.size && block; ++r)
    std::memcpy(out + static_cast<std::size_t>(r) * block,
                s.work.data() + static_cast<std::size_t>(at.block_of(r)) * block, block);
}

// A broadcast goes one way, down a binomial tree from the root (a root that waited for
// its peers' headers would wait a round trip for what MPI's eager broadcast lets it
// skip): each rank forwards the root's message as it came and compares the root's
// header with its own. Only the ranks that differ from the root fail.
void broadcast_packed(const Collective& c, int rank, int n, MPI_Comm comm, Scratch& s) {
  const int rel = (rank - c.root + n) % n;
  const std::size_t payload = c.count * element_size(c.dtype);
  const Header mine = header_of(c);
  const std::byte* message = s.incoming.data();
  int length = 0, mask = 1;
  if (rel == 0) {
    s.work.resize(kHeaderBytes + payload);
    std::memcpy(s.work.data(), &mine, kHeaderBytes);
    if (payload) std::memcpy(s.work.data() + kHeaderBytes, c.input.data, payload);
    message = s.work.data();
    length = static_cast<int>(kHeaderBytes + payload);
    while (mask < n) mask <<= 1;
  } else {
    while (!(rel & mask)) mask <<= 1;  // the parent is rel - mask
    MPI_Status status;
    TROUPE_MPI_CHECK(MPI_Recv(s.incoming.data(), static_cast<int>(kMessageBytes), MPI_BYTE, (rel - mask + c.root) % n,
                              kTag, comm, &status));
    TROUPE_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &length));
  }
  for (mask >>= 1; mask > 0; mask >>= 1)  // forwarded before any check, so no child waits on a failure
    if (rel + mask < n) TROUPE_MPI_CHECK(MPI_Send(message, length, MPI_BYTE, (rel + mask + c.root) % n, kTag, comm));
  if (rel == 0) {
    if (payload && c.output.data != c.input.data) std::memcpy(c.output.data, c.input.data, payload);
    return;
  }
  Header root;
  std::memcpy(&root, message, kHeaderBytes);
  if (std::memcmp(root.low, mine.low, sizeof mine.low) != 0)
    throw_mismatch(c, rank, n, {{signature_in(root), {c.root}}, {signature_of(c), {rank}}});
  if (payload) std::memcpy(c.output.data, message + kHeaderBytes, payload);  // same signature: `length` fits
}

}  // namespace

bool PackedRoute::supports(const Collective& c, bool blocking) const {
  const bool kind = c.kind == K::allreduce || c.kind == K::reduce_scatter || c.kind == K::allgather ||
                    c.kind == K::broadcast || c.kind == K::barrier;
  return kind && !site().shm && options().check_signatures && small_blocking(c, blocking) &&
         std::max(c.input.nbytes(), c.output.nbytes()) <= kPackedCallBytes;
}

std::shared_ptr<Operation> PackedRoute::run(const Collective& c) {
  thread_local Scratch scratch;  // at most a few KB, reused
  const WatchedCall watched(site().watchdog, c);
  const MpiSite& mpi = site().mpi;
  const MPI_Comm check = site().check_comm;
  switch (c.kind) {
    case K::barrier:
    case K::allreduce:
    case K::reduce_scatter: reduce_packed(c, mpi, check, options().timeout, scratch); break;
    case K::allgather: allgather_packed(c, mpi, check, options().timeout, scratch); break;
    case K::broadcast: broadcast_packed(c, mpi.rank, mpi.size, check, scratch); break;
    default: TROUPE_THROW(InvalidArgument, c.describe(), ": not a call that travels packed");
  }
  return nullptr;
}

}  // namespace troupe::collectives::detail
