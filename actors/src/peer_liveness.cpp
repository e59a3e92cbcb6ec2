#include "peer_liveness.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <functional>

#include "troupe/mpi/mpi_error.hpp"
#include "wire.hpp"

namespace troupe::actors::detail {
namespace {

// The liveness communicator carries two kinds of message: heartbeats (a Header) and
// loss notices (the lost rank, an int), told apart by tag.
constexpr int kLostNoticeTag = kActorTag + 1;

}  // namespace

PeerLiveness::PeerLiveness(MPI_Comm comm, int rank, int size, std::chrono::milliseconds period,
                           std::chrono::milliseconds timeout, std::function<void(int, const std::string&)> on_lost)
    : rank_(rank),
      size_(size),
      period_(period),
      timeout_(timeout),
      on_lost_(std::move(on_lost)),
      last_heard_(new std::atomic<Clock::rep>[static_cast<std::size_t>(size)]),
      lost_(new std::atomic<bool>[static_cast<std::size_t>(size)]),
      rank_numbers_(static_cast<std::size_t>(size)),
      heartbeat_(sizeof(Header), '\0') {
  for (int r = 0; r < size; ++r) rank_numbers_[static_cast<std::size_t>(r)] = r;
  TROUPE_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  Header h;
  h.kind = Kind::heartbeat;
  write_header(heartbeat_, h);
  const auto now = Clock::now().time_since_epoch().count();
  for (int r = 0; r < size_; ++r) {
    last_heard_[static_cast<std::size_t>(r)] = now;
    lost_[static_cast<std::size_t>(r)] = false;
  }
  // Learn which ranks share this host, and watch their processes directly.
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const long long mine[2] = {static_cast<long long>(std::hash<std::string>{}(host)), static_cast<long long>(getpid())};
  std::vector<long long> all(2 * static_cast<std::size_t>(size_));
  TROUPE_MPI_CHECK(MPI_Allgather(mine, 2, MPI_LONG_LONG, all.data(), 2, MPI_LONG_LONG, comm_));
  pidfds_.assign(static_cast<std::size_t>(size_), -1);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || all[2 * static_cast<std::size_t>(r)] != mine[0]) continue;
    const long fd = syscall(SYS_pidfd_open, static_cast<pid_t>(all[2 * static_cast<std::size_t>(r) + 1]), 0);
    if (fd < 0) continue;  // an old kernel, or not permitted: heartbeats still cover this rank
    pidfds_[static_cast<std::size_t>(r)] = static_cast<int>(fd);
    pidfd_ranks_.push_back(r);
  }
}

PeerLiveness::~PeerLiveness() {
  stop();
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void PeerLiveness::declare_lost(int rank, const std::string& why, bool tell_others) {
  bool expected = false;
  if (!lost_[static_cast<std::size_t>(rank)].compare_exchange_strong(expected, true)) return;
  any_lost_ = true;
  if (tell_others) {
    // The other ranks do not watch this one: tell each, once. The sends are never
    // waited on (a dead peer must not stall this thread), so they send from
    // rank_numbers_, which lives as long as this object.
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || lost(r)) continue;
      MPI_Request request;
      if (MPI_Isend(&rank_numbers_[static_cast<std::size_t>(rank)], 1, MPI_INT, r, kLostNoticeTag, comm_, &request) ==
          MPI_SUCCESS) {
        MPI_Request_free(&request);
        sent_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  on_lost_(rank, why);
}

int PeerLiveness::successor() const {
  for (int k = 1; k < size_; ++k)
    if (int r = (rank_ + k) % size_; !lost(r)) return r;
  return -1;
}

int PeerLiveness::predecessor() const {
  for (int k = 1; k < size_; ++k)
    if (int r = (rank_ - k + size_) % size_; !lost(r)) return r;
  return -1;
}

void PeerLiveness::start() {
  if (size_ > 1 || hook_) thread_ = std::thread([this] { run(); });
}

void PeerLiveness::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PeerLiveness::set_hook(std::function<void()> hook, std::chrono::milliseconds period) {
  {
    std::lock_guard lock(mutex_);
    hook_ = std::move(hook);
    hook_period_ = period;
  }
  if (!thread_.joinable() && hook_) thread_ = std::thread([this] { run(); });
}

void PeerLiveness::run() {
  auto next_beat = Clock::now(), next_hook = Clock::now();
  std::unique_lock lock(mutex_);
  while (!stop_) {
    const auto now = Clock::now();
    timespec cpu{};  // one clock read per wake-up, ~10 a second
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
      cpu_ns_.store(std::int64_t{cpu.tv_sec} * 1'000'000'000 + cpu.tv_nsec, std::memory_order_relaxed);
    if (size_ > 1) {
      receive_beats();
      check();
      if (now >= next_beat) {
        beat();
        next_beat = now + period_;
      }
    }
    if (hook_ && now >= next_hook) {
      try {
        hook_();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "troupe: rank %d: liveness hook failed: %s\n", rank_, e.what());
      }
      next_hook = now + hook_period_;
    }
    const auto wake_at = hook_ ? std::min(next_beat, next_hook) : next_beat;
    std::vector<pollfd> fds;
    for (int r : pidfd_ranks_)
      if (!lost(r)) fds.push_back({pidfds_[static_cast<std::size_t>(r)], POLLIN, 0});
    if (fds.empty()) {  // no neighbour on this host left to watch: wait for the next beat or stop()
      wake_.wait_until(lock, wake_at, [this] { return stop_; });
      continue;
    }
    // Sleep in poll() on the neighbours' pidfds: one becomes readable when its
    // process exits. stop() is noticed within a period.
    const auto wait_ms =
        std::max<long long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(wake_at - Clock::now()).count());
    lock.unlock();
    const int ready = poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
    if (ready > 0)
      for (const pollfd& p : fds)
        if (p.revents != 0)
          for (int r : pidfd_ranks_)
            if (pidfds_[static_cast<std::size_t>(r)] == p.fd)
              declare_lost(r, "its process exited (seen on this host)", true);
    lock.lock();
  }
}

void PeerLiveness::beat() {
  const int r = successor();
  if (r < 0) return;
  MPI_Request request;
  // Non-blocking and never waited on: a dead peer must not stall this thread.
  if (MPI_Isend(heartbeat_.data(), static_cast<int>(heartbeat_.size()), MPI_BYTE, r, kActorTag, comm_, &request) ==
      MPI_SUCCESS) {
    MPI_Request_free(&request);
    sent_.fetch_add(1, std::memory_order_relaxed);
  }
}

void PeerLiveness::receive_beats() {
  char buffer[sizeof(Header)];
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &status) != MPI_SUCCESS || !flag) return;
    if (status.MPI_TAG == kLostNoticeTag) {
      int lost_rank = -1;
      MPI_Recv(&lost_rank, 1, MPI_INT, status.MPI_SOURCE, kLostNoticeTag, comm_, MPI_STATUS_IGNORE);
      if (lost_rank >= 0 && lost_rank < size_ && lost_rank != rank_)
        declare_lost(lost_rank,
                     "rank " + std::to_string(status.MPI_SOURCE) + ", which watches it, heard nothing from it for " +
                         std::to_string(timeout_.count()) + " ms or saw its process exit",
                     false);
      continue;
    }
    MPI_Recv(buffer, sizeof buffer, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, comm_, MPI_STATUS_IGNORE);
    heard(status.MPI_SOURCE);
  }
}

void PeerLiveness::check() {
  const auto now = Clock::now().time_since_epoch().count();
  const int r = predecessor();
  if (r < 0) return;
  if (r != watched_) {  // a new predecessor has beaten someone else until now: give it a timeout of grace
    watched_ = r;
    last_heard_[static_cast<std::size_t>(r)].store(now);
    return;
  }
  const auto limit = std::chrono::duration_cast<Clock::duration>(timeout_).count();
  if (now - last_heard_[static_cast<std::size_t>(r)].load() <= limit) return;
  declare_lost(
      r, "nothing heard from it for " + std::to_string(timeout_.count()) + " ms (its process has probably died)", true);
}

}  // namespace troupe::actors::detail
