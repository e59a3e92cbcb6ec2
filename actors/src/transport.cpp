#include "transport.hpp"

#include <sys/prctl.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "troupe/mpi/mpi_error.hpp"
#include "wire.hpp"

namespace troupe::actors::detail {

namespace {
using namespace std::chrono_literals;
// After this long without work the progress thread starts to sleep between polls.
constexpr auto kHotPeriod = 100us;
// Of which, this long it spins without yielding.
constexpr auto kSpinPeriod = 20us;

constexpr auto kMaxBackoff = 1ms;
// Sleeps from this long on arm the doorbell. Shorter ones come right after work, when
// the next message is likely near: ringing for them would cost each sender a system
// call to save the receiver a few microseconds.
constexpr auto kDoorbellSleep = 200us;
// How long the thread stays hot after a caller starts blocking on an answer: long
// enough for any round trip, short enough that a driver waiting minutes for an
// epoch does not keep a core busy.
constexpr auto kBlockedHotPeriod = 5ms;
// Messages received per progress step, so one busy sender cannot starve local work.
constexpr int kReceiveBurst = 16;
// This thread is inside receive_some().
thread_local bool t_receiving = false;
// A send of this thread woke a sleeping thread of this node (take_woke_sleeper()).
thread_local bool t_woke_sleeper = false;
}  // namespace

Transport::Transport(MPI_Comm comm, Deliver deliver, Scheduler& scheduler, PeerLiveness* liveness,
                     bool runs_actor_calls, std::chrono::milliseconds attachment_timeout, Doorbells* doorbells)
    : comm_(comm),
      deliver_(std::move(deliver)),
      scheduler_(scheduler),
      runs_actor_calls_(runs_actor_calls),
      liveness_(liveness),
      doorbells_(doorbells != nullptr && doorbells->enabled() ? doorbells : nullptr),
      attachment_timeout_(attachment_timeout) {
  TROUPE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
}

void Transport::wake() {
  // Taking the lock orders this wake after a sleeper's check of its condition, so
  // the wake cannot fall between the check and the wait.
  { std::lock_guard lock(idle_mutex_); }
  idle_cv_.notify_all();
  if (doorbells_) doorbells_->ring(rank_);  // a sleep on the doorbell instead
}

bool Transport::idle_wait(Clock::duration period, const std::function<bool()>& done, bool doorbell) {
  // Without pool threads this is the only thread that runs actor calls: wake for
  // one (a local tell, a call posted by a polling caller) instead of sleeping
  // through it.
  const auto ready = [&] { return done() || (runs_actor_calls_ && scheduler_.has_ready()); };
  if (doorbell && doorbells_) return wait_for_message(period, ready);
  std::unique_lock lock(idle_mutex_);
  idle_cv_.wait_for(lock, period, ready);
  return false;
}

bool Transport::wait_for_message(Clock::duration period, const std::function<bool()>& ready) {
  if (!doorbells_) return false;
  // Armed, look once more: a message posted before the bell was armed was not rung for.
  return doorbells_->wait(period, [&] {
    int arrived = 0;
    TROUPE_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kActorTag, comm_, &arrived, MPI_STATUS_IGNORE));
    return arrived != 0 || ready();
  });
}

Transport::~Transport() {
  stop();
  cancel_held();
}

void Transport::start() {
  thread_ = std::thread([this] {
    thread_id_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    // Linux lets a timed wait overrun by the thread's timer slack, 50 us by default:
    // the backoff's short sleeps (idle/8) then end 50 us late, and a message that
    // arrives during one waits that long -- over TCP, where each poll finds nothing
    // for tens of microseconds, it added ~100 us to every ask. 1 us keeps them short.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    run();
  });
  thread_id_.store(thread_.get_id(), std::memory_order_relaxed);
}

void Transport::stop() {
  stop_ = true;
  wake();
  if (thread_.joinable()) thread_.join();
}

namespace {

// Sends `message` and `attachments` as one MPI message, each piece straight from its
// own buffer (an hindexed datatype over absolute addresses), attachments padded to
// kAttachedAlignment.
void isend_attached(const std::string& message, const std::vector<Bytes>& attachments, int destination, MPI_Comm comm,
                    MPI_Request* request) {
  static const std::byte kPadding[kAttachedAlignment] = {};
  std::vector<int> lengths;
  std::vector<MPI_Aint> addresses;
  lengths.reserve(2 * attachments.size() + 1);
  addresses.reserve(lengths.capacity());
  auto add = [&](const void* data, std::size_t size) {
    MPI_Aint address = 0;
    TROUPE_MPI_CHECK(MPI_Get_address(data, &address));
    lengths.push_back(static_cast<int>(size));
    addresses.push_back(address);
  };
  add(message.data(), message.size());
  std::size_t offset = message.size();
  for (const Bytes& attachment : attachments) {
    if (const std::size_t padded = align_attached(offset); padded > offset) add(kPadding, padded - offset);
    offset = align_attached(offset);
    add(attachment.data(), attachment.size());
    offset += attachment.size();
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  TROUPE_MPI_CHECK(
      MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(), addresses.data(), MPI_BYTE, &type));
  TROUPE_MPI_CHECK(MPI_Type_commit(&type));
  TROUPE_MPI_CHECK(MPI_Isend(MPI_BOTTOM, 1, type, destination, kActorTag, comm, request));
  MPI_Type_free(&type);  // freed once the send no longer needs it
}
}  // namespace

void Transport::send(int destination, std::string& message, const std::vector<Bytes>& attachments) {
  bool attached = false;
  int tag = 0;  // of separate attachments
  if (!attachments.empty()) {
    TROUPE_CHECK(attachments.size() <= 0xffff, "actor message: ", attachments.size(), " attachments, at most 65535");
    std::size_t total = message.size() + (attachments.size() + 1) * sizeof(std::uint64_t);
    for (const Bytes& attachment : attachments) {
      TROUPE_CHECK(attachment.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
                   "actor message: an attachment of ", attachment.size(),
                   " bytes is above MPI's 2 GiB count limit; split it");
      total = align_attached(total) + attachment.size();
    }
    attached = total <= kAttachedLimit;
    Header h;
    std::memcpy(&h, message.data(), sizeof h);
    h.attachments = static_cast<std::uint16_t>(attachments.size());
    if (!attached) tag = kFirstAttachmentTag + static_cast<int>(next_attachment_tag_.fetch_add(1) % kAttachmentTags);
    h.attachment_tag = attached ? kAttachedTag : static_cast<std::uint32_t>(tag);
    write_header(message, h);
    std::vector<std::uint64_t> table;
    table.reserve(attachments.size() + 1);
    for (const Bytes& attachment : attachments) table.push_back(attachment.size());
    if (attached) table.push_back(message.size() + (attachments.size() + 1) * sizeof(std::uint64_t));
    message.insert(sizeof(Header), reinterpret_cast<const char*>(table.data()), table.size() * sizeof(std::uint64_t));
  }
  // Small messages go out eagerly; a large one waits until the receiver matches it.
  // Meanwhile this thread keeps receiving: two ranks whose progress threads both
  // answer with large replies (RuntimeOptions::threads == 0) would otherwise each wait
  // for the other to receive.
  // Most messages have no separate attachments: their one request needs no heap vector.
  const bool separate = !attachments.empty() && !attached;
  MPI_Request single = MPI_REQUEST_NULL;
  std::vector<MPI_Request> several(separate ? 1 + attachments.size() : 0, MPI_REQUEST_NULL);
  MPI_Request* requests = separate ? several.data() : &single;
  const int count = separate ? 1 + static_cast<int>(attachments.size()) : 1;
  if (attached) {
    isend_attached(message, attachments, destination, comm_, &requests[0]);
  } else {
    TROUPE_MPI_CHECK(MPI_Isend(message.data(), static_cast<int>(message.size()), MPI_BYTE, destination, kActorTag,
                               comm_, &requests[0]));
  }
  if (separate) {
    for (std::size_t i = 0; i < attachments.size(); ++i) {
      TROUPE_MPI_CHECK(MPI_Isend(attachments[i].data(), static_cast<int>(attachments[i].size()), MPI_BYTE, destination,
                                 tag, comm_, &requests[i + 1]));
    }
  }
  if (doorbells_ && destination != rank_ && doorbells_->ring(destination)) t_woke_sleeper = true;
  Clock::time_point waiting_since{};  // read only when the send did not complete at once
  for (int done = 0;;) {
    TROUPE_MPI_CHECK(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done) break;
    if (waiting_since == Clock::time_point{}) waiting_since = Clock::now();
    if (!t_receiving) receive_some();
  }
  if (waiting_since != Clock::time_point{}) Scheduler::exclude_from_call_time(Clock::now() - waiting_since);
  sent_.fetch_add(1, std::memory_order_relaxed);
}

bool Transport::receive_some() {
  std::unique_lock lock(receive_mutex_, std::try_to_lock);
  if (!lock) return false;
  // Delivering may resolve futures whose continuations send; such a send must not
  // try to receive again on this thread.
  t_receiving = true;
  struct Reset {
    ~Reset() { t_receiving = false; }
  } reset;
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
    Message message{status.MPI_SOURCE, {}, {}};
    // A message that may carry its attachments within it (more than kInlineBytes)
    // lands in a pooled buffer, which the attachments then share: no copy of them.
    Bytes whole;
    if (static_cast<std::size_t>(count) > kInlineBytes) {
      whole = pool_->acquire(static_cast<std::size_t>(count));
      TROUPE_MPI_CHECK(MPI_Mrecv(const_cast<std::byte*>(whole.data()), count, MPI_BYTE, &handle, &status));
    } else {
      message.bytes.resize(static_cast<std::size_t>(count));
      TROUPE_MPI_CHECK(MPI_Mrecv(message.bytes.data(), count, MPI_BYTE, &handle, &status));
    }
    received_.fetch_add(1, std::memory_order_relaxed);
    const std::string_view view = whole.empty()
                                      ? std::string_view(message.bytes)
                                      : std::string_view(reinterpret_cast<const char*>(whole.data()), whole.size());
    Header h;
    if (view.size() >= sizeof h) std::memcpy(&h, view.data(), sizeof h);
    any = true;
    if (view.size() >= sizeof h && h.magic == kMagic && h.attachments > 0 && h.attachment_tag == kAttachedTag) {
      if (!split_attached(message, whole.empty() ? Bytes::copy_of(view.data(), view.size()) : whole)) continue;
    } else {
      if (!whole.empty()) message.bytes.assign(view);
      if (view.size() >= sizeof h && h.magic == kMagic && h.attachments > 0) {
        hold(std::move(message));
        continue;
      }
    }
    if (const auto queue = held_.find(message.source); queue != held_.end()) {
      queue->second.push_back(Held{std::move(message)});  // behind its sender's held message
      continue;
    }
    deliver_(std::move(message));
  }
  // Held messages keep the caller polling (the progress thread hot), as a receive
  // would have while it waited.
  if (!held_.empty()) any = advance_held() || any;
  return any;
}

bool Transport::progress_once(bool run_local_calls) {
  if (!run_local_calls) return receive_some();
  // Calls received now for short-running actors are run here, after the burst,
  // rather than handed to a pool thread that would have to be woken (scheduler.hpp).
  Scheduler::InlineScope scope;
  const bool received = receive_some();
  const bool ran = scheduler_.run_local(/*shared=*/true);
  return received || ran;
}

bool Transport::take_woke_sleeper() { return std::exchange(t_woke_sleeper, false); }

bool Transport::try_begin_polling() {
  int none = 0;
  return pollers_.compare_exchange_strong(none, 1);
}

void Transport::end_polling() {
  poll_ended_.store(Clock::now().time_since_epoch().count());
  pollers_.fetch_sub(1);
  // The progress thread looks again within kMaxBackoff on its own, as soon as it
  // would have after a wake-up and a poll that found nothing. A wake-up now costs the
  // caller a system call and, on a machine whose cores are busy, the core it needs
  // for its next ask -- unless a thread blocks on an answer that nobody else will
  // now receive.
  if (blocked_.load() > 0) wake();
}

void Transport::begin_blocking() {
  blocked_.fetch_add(1);
  hot_until_.store((Clock::now() + kBlockedHotPeriod).time_since_epoch().count());
  wake();
}

void Transport::end_blocking() { blocked_.fetch_sub(1); }

bool Transport::wait_request(MPI_Request* request, const std::function<bool()>& give_up) {
  if (is_progress_thread() || !thread_.joinable()) {
    for (;;) {
      int done = 0;
      TROUPE_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
      if (done) return true;
      if (give_up()) return false;
      if (!progress_once(/*run_local_calls=*/true)) std::this_thread::yield();
    }
  }
  std::lock_guard one_waiter(request_waiter_mutex_);  // one watched request at a time
  std::unique_lock lock(watch_mutex_);
  watch_done_ = false;
  watched_.store(request);
  wake();
  watch_cv_.wait(lock, [&] { return watch_done_ || give_up(); });
  const bool done = watch_done_;
  // The progress thread tests only under watch_mutex_, so it is done with the request.
  watched_.store(nullptr);
  return done;
}

void Transport::interrupt_waits() {
  { std::lock_guard lock(watch_mutex_); }
  watch_cv_.notify_all();
}

void Transport::test_watched() {
  std::unique_lock lock(watch_mutex_);
  MPI_Request* request = watched_.load();
  if (request == nullptr || watch_done_) return;
  int done = 0;
  TROUPE_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
  if (!done) return;
  watch_done_ = true;
  lock.unlock();
  watch_cv_.notify_all();
}

void Transport::run() {
  auto last_active = Clock::now();
  bool busy = false;  // worked since last_active was stamped
  while (!stop_) {
    // A collective of the runtime's that a thread waits for: tested at every turn,
    // which is at least once per kMaxBackoff.
    if (watched_.load(std::memory_order_relaxed) != nullptr) {
      try {
        test_watched();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "troupe: progress thread: %s\n", e.what());
      }
    }
    if (pollers_.load() > 0) {  // a waiting caller drives progress; don't compete for the core
      // ...but it runs no actor calls: without pool threads they are this thread's.
      if (runs_actor_calls_ && scheduler_.run_local(/*shared=*/true)) continue;
      idle_wait(kMaxBackoff, [this] { return stop_.load() || pollers_.load() == 0; });
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
      // Stamped at the first poll that finds nothing: one clock read per busy spell,
      // not per message (a read costs ~35 ns here, a tell ~1 us).
      busy = true;
      continue;
    }
    const auto now = Clock::now();
    if (busy) {
      last_active = now;
      busy = false;
    }
    const auto idle = now - last_active;
    // A caller that polled a moment ago will most likely poll again (its next ask):
    // the spinning is its to do, and a second spinner would only take its core.
    const bool caller_polls = now - Clock::time_point(Clock::duration(poll_ended_.load())) < kHotPeriod;
    const bool caller_blocks = blocked_.load() > 0 && now.time_since_epoch().count() < hot_until_.load();
    if ((idle < kHotPeriod && !caller_polls) || caller_blocks) {
      // Right after a message the next one usually follows within microseconds:
      // spin without a system call (sched_yield costs over 1 us on these VMs) at
      // first, then yield the core to anyone who needs it.
      if (idle < kSpinPeriod) {
        for (int i = 0; i < 2; ++i) cpu_relax();
      } else {
        std::this_thread::yield();
      }
      continue;
    }
    // After a caller's poll, sleep until it has most likely started its next one
    // (which stands this thread aside) rather than waking every few microseconds.
    const auto backoff = caller_polls ? Clock::duration(kHotPeriod) : std::min<Clock::duration>(kMaxBackoff, idle / 8);
    const auto hot_before = hot_until_.load();
    // Rung by a message: stay hot for what usually follows it (over TCP, the bytes).
    if (idle_wait(
            backoff, [&] { return stop_.load() || hot_until_.load() != hot_before; },
            /*doorbell=*/!caller_polls && backoff >= kDoorbellSleep))
      last_active = Clock::now();
  }
}

}  // namespace troupe::actors::detail
