#include "doorbell.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <ctime>
#include <string>

#include "troupe/mpi/agree.hpp"
#include "troupe/mpi/mpi_error.hpp"
#include "troupe/mpi/shared_segment.hpp"

namespace troupe::actors::detail {

namespace {

// Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

// The mark, read after everything this thread wrote before (the message): a fence
// and a load, not a read-modify-write, so the line stays shared while nobody sleeps
// (fetch_add(0) took it from the sleeper's core on every send, 6% of a task's
// sender). TSan supports no fences: there, the read-modify-write.
bool marked_after_fence(std::atomic<std::uint32_t>& asleep) {
#if defined(__SANITIZE_THREAD__)
  return asleep.fetch_add(0, std::memory_order_seq_cst) != 0;
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return asleep.load(std::memory_order_relaxed) != 0;
#endif
}

}  // namespace

Doorbells::Doorbells(MPI_Comm comm) {
  int size = 0;
  TROUPE_MPI_CHECK(MPI_Comm_size(comm, &size));
  of_rank_.assign(static_cast<std::size_t>(size), nullptr);
  MPI_Comm node = MPI_COMM_NULL;
  TROUPE_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 0, locals = 0, rank = 0;
  TROUPE_MPI_CHECK(MPI_Comm_rank(node, &local));
  TROUPE_MPI_CHECK(MPI_Comm_size(node, &locals));
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  std::vector<int> ranks(static_cast<std::size_t>(locals));  // comm's rank of each local one
  TROUPE_MPI_CHECK(MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, node));

  const std::string name = mpi::unique_segment_name(node, "/troupe-bells-");
  bytes_ = sizeof(Bell) * static_cast<std::size_t>(locals);
  std::byte* p = local == 0 ? mpi::map_shared_segment(name, bytes_, true) : nullptr;  // zero-filled: nobody asleep
  if (mpi::all_agree(node, local != 0 || p != nullptr) && local != 0) p = mpi::map_shared_segment(name, bytes_, false);
  const bool mapped = mpi::all_agree(node, p != nullptr);
  if (local == 0) mpi::unlink_shared_segment(name);  // every rank that could has mapped it
  TROUPE_MPI_CHECK(MPI_Comm_free(&node));
  if (!mapped) {
    mpi::unmap_shared_segment(p, bytes_);
    if (local == 0)
      std::fprintf(stderr, "troupe: rank %d: no shared memory for doorbells; idle ranks answer within 1 ms\n", rank);
    return;
  }
  bells_ = static_cast<Bell*>(static_cast<void*>(p));
  self_ = &bells_[local];
  for (int i = 0; i < locals; ++i) of_rank_[static_cast<std::size_t>(ranks[static_cast<std::size_t>(i)])] = &bells_[i];
}

Doorbells::~Doorbells() { mpi::unmap_shared_segment(static_cast<std::byte*>(static_cast<void*>(bells_)), bytes_); }

bool Doorbells::ring(int rank) {
  if (rank < 0 || static_cast<std::size_t>(rank) >= of_rank_.size()) return false;
  Bell* bell = of_rank_[static_cast<std::size_t>(rank)];
  if (bell == nullptr) return false;
  // After the message is posted, read the mark: see the sleeper's, or the sleeper's
  // probe sees the message.
  if (!marked_after_fence(bell->asleep)) return false;
  // One wake-up a sleep: until a sleeper arms again, those rung are on their way. A
  // woken thread waiting for a core stays marked, and every send in the meantime
  // made a system call (6% of the replies of an 8 B ask loop, 1-3 us each).
  if (bell->rung.exchange(1, std::memory_order_seq_cst) != 0) return false;
  bell->rings.fetch_add(1, std::memory_order_seq_cst);
  futex(&bell->rings, FUTEX_WAKE, INT_MAX, nullptr);
  return true;
}

bool Doorbells::wait(std::chrono::nanoseconds period, const std::function<bool()>& ready) {
  if (self_ == nullptr) return false;
  const std::uint32_t rings = self_->rings.load(std::memory_order_seq_cst);
  self_->rung.store(0, std::memory_order_seq_cst);        // before the mark: a ring after it wakes
  self_->asleep.fetch_add(1, std::memory_order_seq_cst);  // before the last look, as ring()'s
  bool rung = false;
  if (!ready()) {
    const auto s = std::chrono::duration_cast<std::chrono::seconds>(period);
    const timespec timeout{static_cast<time_t>(s.count()), static_cast<long>((period - s).count())};
    futex(&self_->rings, FUTEX_WAIT, rings, &timeout);  // returns at once if rung since `rings`
    rung = self_->rings.load(std::memory_order_seq_cst) != rings;
  }
  self_->asleep.fetch_sub(1, std::memory_order_seq_cst);
  return rung;
}

}  // namespace troupe::actors::detail
