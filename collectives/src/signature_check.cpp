#include "signature_check.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shm_channel.hpp"
#include "troupe/collectives/collective_error.hpp"
#include "troupe/collectives/options.hpp"
#include "troupe/cpu_relax.hpp"
#include "troupe/error.hpp"
#include "troupe/keep_until_exit.hpp"
#include "troupe/mpi/mpi_error.hpp"

namespace troupe::collectives::detail {

Signature signature_of(const Collective& c) {
  return {static_cast<std::int64_t>(c.sequence),
          static_cast<std::int64_t>(c.kind),
          static_cast<std::int64_t>(c.count),
          static_cast<std::int64_t>(c.dtype),
          c.has_op() ? static_cast<std::int64_t>(c.op) : -1,
          c.has_root() ? c.root : -1};
}

namespace {

constexpr int kFields = kSignatureFields;
using Clock = std::chrono::steady_clock;

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

// Every rank's call, grouped: the message every detector of a mismatch gives.
std::string mismatch_message(const Collective& collective, int rank, int size,
                             const std::map<Signature, std::vector<int>>& ranks_by_call) {
  std::string calls;
  for (const auto& [sig, ranks] : ranks_by_call) {
    calls += ranks.size() == 1 ? "\n  rank " : "\n  ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) calls += troupe::detail::concat(i ? "," : "", ranks[i]);
    calls += ": " + describe(sig);
  }
  return troupe::detail::concat("collective mismatch at sequence #", collective.sequence, " (seen on rank ", rank,
                                " of ", size, "); the ranks issued different calls:", calls);
}

// Polls `done` until it returns true; calls `expired` (which throws) once `timeout`
// has passed. Spins for the first polls (a peer on another core answers within a
// microsecond), then yields on every poll: with more ranks than free cores the peer
// may be waiting for this very core, and a spinner would keep it off for a whole
// time slice per call (Open MPI yields the same way when oversubscribed).
template <class Done, class Expired>
void poll_until(Done done, std::chrono::milliseconds timeout, Expired expired) {
  constexpr std::uint64_t kSpins = 1024;
  Clock::time_point deadline;  // read once the spins are spent: a clock read is 10% of a small call
  for (std::uint64_t polls = 0; !done(); ++polls) {
    if (polls < kSpins) {
      troupe::detail::cpu_relax();
      continue;
    }
    if (polls == kSpins) deadline = Clock::now() + timeout;
    if ((polls & 63) == 0 && timeout != kNoTimeout && Clock::now() >= deadline) expired();
    std::this_thread::yield();
  }
}

// A hint, no more: fetch `line` for writing (PREFETCHW on x86).
inline void prefetch_for_write(const void* line) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(line)));
#else
  __builtin_prefetch(line, 1);
#endif
}

}  // namespace

void throw_mismatch(const Collective& collective, int rank, int size,
                    const std::map<Signature, std::vector<int>>& ranks_by_call) {
  TROUPE_THROW(CollectiveMismatch, mismatch_message(collective, rank, size, ranks_by_call));
}

// ---- the board ----

namespace {
// The root's broadcasts are checked here, at a later call (`next`; null: the
// communicator is going), rather than in the broadcast (board_route.cpp); the error
// says where it was found. All of ShmChannel::unverified at once, oldest first: the
// peers' lines are fetched together first, so the batch costs about one cross-core
// read, not one per broadcast.
void verify_unverified(ShmChannel& board, const Collective* next, std::chrono::milliseconds timeout) {
  for (const Collective& sent : board.unverified)
    for (int r = 0; r < board.size(); ++r)
      if (r != board.rank()) __builtin_prefetch(&board.board_entry(r, sent.sequence));
  const auto found = [&] {
    return next ? troupe::detail::concat(" [found when rank ", board.rank(), ", the root, issued a later call, ",
                                         next->describe(), "]")
                : std::string();
  };
  for (const Collective& sent : board.unverified) {
    try {
      wait_for_peers(board, sent, timeout);
    } catch (const CollectiveMismatch& e) {
      board.unverified.clear();
      throw CollectiveMismatch(e.what() + found());
    } catch (const TimeoutError& e) {
      board.unverified.clear();
      throw TimeoutError(e.what() + found());
    }
  }
  mark_checked(board, board.unverified.back());
  board.unverified.clear();
}
}  // namespace

void publish_signature(ShmChannel& board, const Collective& collective, std::chrono::milliseconds timeout,
                       std::span<const std::byte> payload, bool root_runs_ahead) {
  if (!board.unverified.empty() && (!root_runs_ahead || board.unverified.size() >= ShmChannel::kRootRunAhead))
    verify_unverified(board, &collective, timeout);
  const std::uint64_t sequence = collective.sequence;
  if (sequence >= ShmChannel::kBoardEntries) {
    // The entry is reused from call (sequence - kBoardEntries): every peer must have
    // checked that one. The floor is cached, so the peers' counters are read rarely.
    const std::uint64_t needed = sequence - ShmChannel::kBoardEntries + 1;
    if (board.board_floor < needed) {
      poll_until(
          [&] {
            std::uint64_t floor = UINT64_MAX;
            for (int r = 0; r < board.size(); ++r)
              if (r != board.rank()) floor = std::min(floor, board.checked(r).load(std::memory_order_acquire));
            board.board_floor = floor;
            return floor >= needed;
          },
          timeout,
          [&] {
            TROUPE_THROW(TimeoutError, "publishing the signature of ", collective.describe(), " on rank ", board.rank(),
                         ": a peer has not checked call #", needed - 1, " within ", timeout.count(), " ms");
          });
    }
  }
  ShmChannel::BoardEntry& entry = board.board_entry(board.rank(), sequence);
  if (!payload.empty()) std::memcpy(board.board_payload(board.rank(), sequence), payload.data(), payload.size());
  const Signature s = signature_of(collective);
  for (int i = 0; i < kFields; ++i)
    std::atomic_ref<std::int64_t>(entry.fields[i]).store(s[static_cast<std::size_t>(i)], std::memory_order_relaxed);
  std::atomic_ref<std::uint64_t>(entry.sequence_plus_one).store(sequence + 1, std::memory_order_release);
  // Take ownership of a later entry's line now. A store to a line that a peer has read
  // waits for the peer's copy to be invalidated, and the lock-prefixed instruction that
  // follows every call (the submit mutex) waits for that store: up to 0.3 us a call
  // when the two cores sit far apart. Claimed ahead, that wait overlaps the calls
  // between.
  prefetch_for_write(&board.board_entry(board.rank(), sequence + 2));
}

std::optional<std::string> board_verdict(const ShmChannel& board, const Collective& collective) {
  const std::uint64_t sequence = collective.sequence;
  const Signature mine = signature_of(collective);
  bool differs = false;
  for (int r = 0; r < board.size(); ++r) {
    if (r == board.rank()) continue;
    ShmChannel::BoardEntry& entry = board.board_entry(r, sequence);
    if (std::atomic_ref<std::uint64_t>(entry.sequence_plus_one).load(std::memory_order_acquire) != sequence + 1)
      return std::nullopt;  // not published yet
    for (int i = 0; i < kFields && !differs; ++i)
      differs = std::atomic_ref<std::int64_t>(entry.fields[i]).load(std::memory_order_relaxed) !=
                mine[static_cast<std::size_t>(i)];
  }
  if (!differs) return std::string();
  std::map<Signature, std::vector<int>> ranks_by_call;
  for (int r = 0; r < board.size(); ++r) {
    ShmChannel::BoardEntry& entry = board.board_entry(r, sequence);
    Signature s{};
    for (int i = 0; i < kFields; ++i)
      s[static_cast<std::size_t>(i)] = std::atomic_ref<std::int64_t>(entry.fields[i]).load(std::memory_order_relaxed);
    ranks_by_call[r == board.rank() ? mine : s].push_back(r);
  }
  return mismatch_message(collective, board.rank(), board.size(), ranks_by_call);
}

bool board_agrees(ShmChannel& board, const Collective& collective) {
  const std::optional<std::string> verdict = board_verdict(board, collective);
  if (!verdict) return false;
  if (!verdict->empty()) TROUPE_THROW(CollectiveMismatch, *verdict);
  mark_checked(board, collective);
  return true;
}

void mark_checked(ShmChannel& board, const Collective& collective) {
  std::atomic_ref<std::uint64_t> checked = board.checked(board.rank());
  if (checked.load(std::memory_order_relaxed) < collective.sequence + 1)
    checked.store(collective.sequence + 1, std::memory_order_release);
}

void wait_for_board(ShmChannel& board, const Collective& collective, std::chrono::milliseconds timeout) {
  wait_for_peers(board, collective, timeout);
  mark_checked(board, collective);
}

void wait_for_peers(ShmChannel& board, const Collective& collective, std::chrono::milliseconds timeout) {
  std::optional<std::string> verdict;
  poll_until([&] { return (verdict = board_verdict(board, collective)).has_value(); }, timeout,
             [&] {
               int missing = 0;
               while (missing < board.size() - 1 &&
                      std::atomic_ref<std::uint64_t>(board.board_entry(missing, collective.sequence).sequence_plus_one)
                              .load(std::memory_order_acquire) == collective.sequence + 1)
                 ++missing;
               TROUPE_THROW(TimeoutError, collective.describe(), " on rank ", board.rank(), " of ", board.size(),
                            ": rank ", missing, " did not issue this call within ", timeout.count(), " ms");
             });
  if (!verdict->empty()) TROUPE_THROW(CollectiveMismatch, *verdict);
}

void settle_unverified(ShmChannel& board, std::chrono::milliseconds bound) noexcept {
  try {
    if (!board.unverified.empty()) verify_unverified(board, nullptr, bound);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: rank %d: the communicator was destroyed before its last broadcast was verified: %s\n",
                 board.rank(), e.what());
    std::fflush(stderr);
  }
}

void verify_signature(MPI_Comm comm, const Collective& collective, int rank, int size,
                      std::chrono::milliseconds timeout) {
  // Heap-allocated: on a timeout MPI may still write here, so it is then leaked.
  auto mine = std::make_unique<Signature>(signature_of(collective));
  auto all = std::make_unique<std::vector<Signature>>(static_cast<std::size_t>(size));
  MPI_Request request = MPI_REQUEST_NULL;
  TROUPE_MPI_CHECK(
      MPI_Iallgather(mine->data(), kFields, MPI_INT64_T, all->data(), kFields, MPI_INT64_T, comm, &request));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int flag = 0, polls = 0; !flag; ++polls) {
    TROUPE_MPI_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
    if (!flag && timeout != kNoTimeout && (polls & 7) == 7 && std::chrono::steady_clock::now() >= deadline) {
      troupe::detail::keep_until_exit(mine.release());
      troupe::detail::keep_until_exit(all.release());
      TROUPE_THROW(TimeoutError, "the signature check of ", collective.describe(), " on rank ", rank,
                   ": not every rank reached it within ", timeout.count(), " ms");
    }
  }
  std::map<Signature, std::vector<int>> ranks_by_call;
  for (int r = 0; r < size; ++r) ranks_by_call[(*all)[r]].push_back(r);
  if (ranks_by_call.size() == 1) return;
  throw_mismatch(collective, rank, size, ranks_by_call);
}

SignatureExchange::SignatureExchange(const Collective& collective) {
  const Signature s = signature_of(collective);
  for (int i = 0; i < kFields; ++i) {
    send_[static_cast<std::size_t>(i)] = s[static_cast<std::size_t>(i)];
    send_[static_cast<std::size_t>(kFields + i)] = -s[static_cast<std::size_t>(i)];
  }
}

void SignatureExchange::start(MPI_Comm comm) {
  TROUPE_MPI_CHECK(MPI_Iallreduce(send_.data(), received_.data(), 2 * kFields, MPI_INT64_T, MPI_MIN, comm, &request_));
}

bool SignatureExchange::test() {
  if (request_ == MPI_REQUEST_NULL) return true;
  int flag = 0;
  TROUPE_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
  return flag != 0;
}

bool SignatureExchange::agreed() const {
  for (std::size_t i = 0; i < kFields; ++i)  // min == max, the max read back from min(-s)
    if (received_[i] != -received_[kFields + i]) return false;
  return true;
}

namespace {

[[noreturn]] void name_the_mismatch(MPI_Comm comm, const Collective& collective, int rank, int size,
                                    std::chrono::milliseconds timeout) {
  verify_signature(comm, collective, rank, size, timeout);  // throws: the signatures differ
  TROUPE_THROW(CollectiveMismatch, "collective mismatch at ", collective.describe(), " (seen on rank ", rank, " of ",
               size, "): the ranks' signatures differ");
}

}  // namespace

void throw_if_mismatched(SignatureExchange& exchange, MPI_Comm comm, const Collective& collective, int rank, int size,
                         std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(5));
  bool done = false;
  while (!(done = exchange.test()) && Clock::now() < deadline) {
  }
  if (done && !exchange.agreed()) name_the_mismatch(comm, collective, rank, size, timeout);
}

namespace {

// An operation with its signature checked beside it, on the board or by an exchange.
class SignedOperation final : public Operation {
 public:
  SignedOperation(std::shared_ptr<Operation> inner, ShmChannel* board, MPI_Comm comm, int rank, int size,
                  std::chrono::milliseconds timeout, std::shared_ptr<StartOrder> order,
                  std::function<void()> on_mismatch)
      : Operation(inner->collective()),
        inner_(std::move(inner)),
        board_(board),
        exchange_(inner_->collective()),
        comm_(comm),
        rank_(rank),
        size_(size),
        timeout_(timeout),
        order_(std::move(order)),
        ticket_(order_ ? order_->issued++ : 0),
        on_mismatch_(std::move(on_mismatch)) {}

  void start() override {
    if (board_)
      publish_signature(*board_, collective(), timeout_);
    else
      exchange_.start(comm_);
    if (!order_) start_inner();
  }

  bool progress() override {
    if (!signed_) signed_ = signature_agrees();
    if (!inner_started_) {
      if (!signed_ || order_->started != ticket_) return false;
      start_inner();
      ++order_->started;
    }
    if (!inner_done_) {
      try {
        inner_done_ = inner_->progress();
      } catch (...) {
        inner_failed();
        throw;
      }
    }
    return signed_ && inner_done_;
  }

  bool queue_device_wait() override { return inner_started_ && inner_->queue_device_wait(); }

  std::string waiting_on() const override {
    return inner_done_ || !inner_started_ ? "its signature check (a rank has not issued this call)"
                                          : inner_->waiting_on();
  }

 private:
  void start_inner() {
    try {
      inner_->start();  // the ring's start already moves data, and can fail as progress can
    } catch (...) {
      inner_failed();
      throw;
    }
    inner_started_ = true;
  }
  // Calls of different sizes can fail inside MPI before their signatures meet: wait a
  // moment for them, so that the error names the mismatch (signature_agrees throws it).
  void inner_failed() {
    keep_inner();
    const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(5));
    while (!signed_ && Clock::now() < deadline) signed_ = signature_agrees();
  }
  // True once every rank's signature is in and equal; throws on a mismatch.
  bool signature_agrees() {
    try {
      if (board_) return board_agrees(*board_, collective());
      if (!exchange_.test()) return false;
      if (!exchange_.agreed()) name_the_mismatch(comm_, collective(), rank_, size_, timeout_);
      return true;
    } catch (const CollectiveMismatch&) {
      keep_inner();
      if (auto abandon = std::exchange(on_mismatch_, nullptr)) abandon();
      throw;
    } catch (...) {
      keep_inner();
      throw;
    }
  }
  // The data part may still be in flight on some rank after a mismatch: never freed.
  void keep_inner() {
    if (!kept_) troupe::detail::keep_until_exit(new std::shared_ptr<Operation>(inner_));
    kept_ = true;
  }

  std::shared_ptr<Operation> inner_;
  ShmChannel* board_;
  SignatureExchange exchange_;
  MPI_Comm comm_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<StartOrder> order_;  // null: `inner` starts with the check
  std::uint64_t ticket_;
  bool signed_ = false, inner_started_ = false, inner_done_ = false, kept_ = false;
  std::function<void()> on_mismatch_;
};

}  // namespace

void finish_signature_check(SignatureExchange& exchange, MPI_Comm comm, const Collective& collective, int rank,
                            int size, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (int polls = 0; !exchange.test(); ++polls) {
    if (timeout != kNoTimeout && (polls & 63) == 63 && Clock::now() >= deadline)
      TROUPE_THROW(TimeoutError, "the signature exchange of ", collective.describe(), " on rank ", rank,
                   ": not every rank issued this call within ", timeout.count(), " ms");
  }
  if (!exchange.agreed()) name_the_mismatch(comm, collective, rank, size, timeout);
}

std::shared_ptr<Operation> with_signature_check(std::shared_ptr<Operation> inner, ShmChannel* board, MPI_Comm comm,
                                                int rank, int size, std::chrono::milliseconds timeout,
                                                std::shared_ptr<StartOrder> order, std::function<void()> on_mismatch) {
  return std::make_shared<SignedOperation>(std::move(inner), board, comm, rank, size, timeout, std::move(order),
                                           std::move(on_mismatch));
}

}  // namespace troupe::collectives::detail
