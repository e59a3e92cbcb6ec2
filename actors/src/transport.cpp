#include "transport.hpp"

#include "troupe/mpi/mpi_error.hpp"
#include "wire.hpp"

namespace troupe::actors::detail {

namespace {
using namespace std::chrono_literals;
// After this long without work the progress thread starts to sleep between polls.
constexpr auto kHotPeriod = 100us;
constexpr auto kMaxBackoff = 1ms;
// How long the thread stays hot after a caller starts blocking on an answer: long
// enough for any round trip, short enough that a driver waiting minutes for an
// epoch does not keep a core busy.
constexpr auto kBlockedHotPeriod = 5ms;
// Messages received per progress step, so one busy sender cannot starve local work.
constexpr int kReceiveBurst = 16;
}  // namespace

Transport::Transport(MPI_Comm comm, Deliver deliver, boost::asio::io_context& io, PeerLiveness* liveness)
    : comm_(comm), deliver_(std::move(deliver)), io_(io), liveness_(liveness) {}

Transport::~Transport() { stop(); }

void Transport::start() {
  thread_ = std::thread([this] { run(); });
  thread_id_ = thread_.get_id();
}

void Transport::stop() {
  stop_ = true;
  idle_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Transport::send(int destination, const std::string& bytes) {
  // Small messages go out eagerly; a large one blocks until the receiver's progress
  // (a thread that never sends while holding the receive role) matches it.
  TROUPE_MPI_CHECK(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, destination, kActorTag, comm_));
  sent_.fetch_add(1, std::memory_order_relaxed);
}

bool Transport::receive_some() {
  std::unique_lock lock(receive_mutex_, std::try_to_lock);
  if (!lock) return false;
  bool any = false;
  for (int i = 0; i < kReceiveBurst; ++i) {
    int flag = 0;
    MPI_Message handle;
    MPI_Status status;
    TROUPE_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, kActorTag, comm_, &flag, &handle, &status));
    if (!flag) break;
    if (liveness_) liveness_->heard(status.MPI_SOURCE);
    int count = 0;
    TROUPE_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
    Message message{status.MPI_SOURCE, std::string(static_cast<std::size_t>(count), '\0')};
    TROUPE_MPI_CHECK(MPI_Mrecv(message.bytes.data(), count, MPI_BYTE, &handle, &status));
    received_.fetch_add(1, std::memory_order_relaxed);
    deliver_(std::move(message));
    any = true;
  }
  return any;
}

bool Transport::progress_once(bool run_local_calls) {
  const bool received = receive_some();
  // Run one ready actor call here rather than wait for a pool thread to wake up.
  const bool ran = run_local_calls && io_.poll_one() > 0;
  return received || ran;
}

bool Transport::try_begin_polling() {
  int none = 0;
  return pollers_.compare_exchange_strong(none, 1);
}

void Transport::end_polling() {
  pollers_.fetch_sub(1);
  idle_cv_.notify_all();
}

void Transport::begin_blocking() {
  hot_until_.store((Clock::now() + kBlockedHotPeriod).time_since_epoch().count());
  idle_cv_.notify_all();
}

void Transport::end_blocking() {}

void Transport::run() {
  auto last_active = Clock::now();
  while (!stop_) {
    const auto now = Clock::now();
    if (pollers_.load() > 0) {  // a waiting caller drives progress; don't compete for the core
      std::unique_lock lock(idle_mutex_);
      idle_cv_.wait_for(lock, kMaxBackoff, [this] { return stop_.load() || pollers_.load() == 0; });
      continue;
    }
    bool worked = false;
    try {
      worked = progress_once(/*run_local_calls=*/true);
    } catch (const std::exception& e) {
      // An MPI failure here has no caller to go to; report it and keep serving.
      std::fprintf(stderr, "troupe: progress thread: %s\n", e.what());
    }
    if (worked) {
      last_active = Clock::now();
      continue;
    }
    const auto idle = Clock::now() - last_active;
    if (idle < kHotPeriod || now.time_since_epoch().count() < hot_until_.load()) {
      std::this_thread::yield();
      continue;
    }
    const auto backoff = std::min<Clock::duration>(kMaxBackoff, idle / 8);
    std::unique_lock lock(idle_mutex_);
    const auto hot_before = hot_until_.load();
    idle_cv_.wait_for(lock, backoff, [&] { return stop_.load() || hot_until_.load() != hot_before; });
  }
}

}  // namespace troupe::actors::detail
