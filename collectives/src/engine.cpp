#include "engine.hpp"

#include "troupe/collectives/collective_error.hpp"
#include "troupe/collectives/reduce_op.hpp"
#include "troupe/error.hpp"
#include "troupe/json_string.hpp"
#include "troupe/keep_until_exit.hpp"
#include "troupe/tensor/dtype.hpp"

namespace troupe::collectives::detail {

namespace {
// Counts a thread as waiting, so the progress thread stays parked while it polls.
class WaiterScope {
 public:
  WaiterScope(std::atomic<int>& waiters, std::condition_variable& wake) : waiters_(waiters), wake_(wake) {
    waiters_.fetch_add(1, std::memory_order_acq_rel);
  }
  ~WaiterScope() {
    if (waiters_.fetch_sub(1, std::memory_order_acq_rel) == 1) wake_.notify_one();
  }

 private:
  std::atomic<int>& waiters_;
  std::condition_variable& wake_;
};

std::string format_ms(std::chrono::milliseconds ms) { return troupe::detail::concat(ms.count(), " ms"); }

// The span's figures: what a reader of the timeline asks of a collective.
std::string trace_args(const Collective& c) {
  std::string args = troupe::detail::concat("\"sequence\":", c.sequence, ",\"bytes\":", c.count * element_size(c.dtype),
                                            ",\"count\":", c.count, ",\"dtype\":\"", tensor::dtype_name(c.dtype), "\"");
  if (c.has_op()) args += troupe::detail::concat(",\"op\":\"", reduce_op_name(c.op), "\"");
  if (c.has_root()) args += troupe::detail::concat(",\"root\":", c.root);
  if (c.is_point_to_point()) args += troupe::detail::concat(",\"peer\":", c.root, ",\"tag\":", c.tag);
  return args;
}
}  // namespace

void Engine::set_tracer(Tracer* tracer, std::string track) {
  std::lock_guard lock(mutex_);
  track_ = std::move(track);
  tracer_.store(tracer, std::memory_order_release);
}

Engine::Engine(Options options, int rank, int size) : options_(options), rank_(rank), size_(size) {}

Engine::~Engine() { stop(); }

void Engine::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (progress_thread_.joinable()) progress_thread_.join();
}

void Engine::launch(const std::shared_ptr<Operation>& operation, bool blocking) {
  std::unique_lock lock(mutex_);
  if (failed_) {
    TROUPE_THROW(CommunicatorFailed, operation->collective().describe(),
                 ": the communicator failed earlier: ", failure_);
  }
  operation->engine_ = shared_from_this();
  operation->launch_index_ = launches_++;
  if (Tracer* tracer = tracer_.load(std::memory_order_acquire); tracer != nullptr && tracer->recording())
    operation->traced_begin_ns_ = Tracer::now_ns();
  operation->start();  // throws to the caller, nothing tracked
  in_flight_.push_back(operation);
  in_flight_count_.store(in_flight_.size(), std::memory_order_release);
  if (blocking) return;
  if (options_.progress_thread && !progress_thread_.joinable() && !stopping_) {
    progress_thread_ = std::thread([this] { progress_loop(); });
  }
  lock.unlock();
  wake_.notify_one();
}

void Engine::record_span_locked(const Collective& c, std::int64_t begin_ns) {
  Tracer* tracer = tracer_.load(std::memory_order_acquire);
  if (tracer == nullptr) return;
  tracer->record(TraceSpan{.name = std::string(collective_name(c.kind)),
                           .category = "collective",
                           .begin_ns = begin_ns,
                           .end_ns = Tracer::now_ns(),
                           .thread = Tracer::this_thread_id(),
                           .track = track_,
                           .args = trace_args(c)});
}

void Engine::record_finished_on_caller(const Collective& c, std::int64_t begin_ns) {
  std::lock_guard lock(mutex_);
  record_span_locked(c, begin_ns);
}

void Engine::finish(Operation& operation, std::exception_ptr error) {
  if (operation.traced_begin_ns_ != 0) record_span_locked(operation.collective(), operation.traced_begin_ns_);
  operation.error_ = std::move(error);
  operation.done_.store(true, std::memory_order_release);
}

void Engine::progress() {
  std::lock_guard lock(mutex_);
  progress_locked();
}

bool Engine::idle() const {
  std::lock_guard lock(mutex_);
  return in_flight_.empty();
}

void Engine::progress_locked() {
  // In order: an operation may depend on the one before it (a staged allgather on
  // its flat allgather), and MPI matches collectives in posting order anyway.
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    Operation& op = **it;
    bool finished = false;
    std::exception_ptr error;
    try {
      finished = op.progress();
    } catch (...) {
      finished = true;
      error = std::current_exception();
    }
    if (!finished) {
      ++it;
      continue;
    }
    auto keep = *it;  // the waiter may drop its handle as soon as done_ is set
    it = in_flight_.erase(it);
    finish(op, error);
    in_flight_count_.store(in_flight_.size(), std::memory_order_release);
    if (error) {
      // One failed collective leaves the ranks out of step; refuse everything after it.
      std::string why;
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        why = e.what();
      } catch (...) {
        why = "unknown error";
      }
      fail_locked(why);
      return;
    }
  }
}

bool Engine::finished_locked(const Operation& operation) const {
  return operation.done() && (in_flight_.empty() || in_flight_.front()->launch_index_ > operation.launch_index_);
}

void Engine::wait(Operation& operation, std::chrono::milliseconds timeout) {
  // Finishing the earlier operations too means a dropped handle's buffers are free
  // once any later handle's wait returns (MPI may complete collectives out of order).
  WaiterScope waiting(waiters_, wake_);
  const bool forever = timeout == kNoTimeout;
  const auto deadline =
      forever ? std::chrono::steady_clock::time_point::max() : std::chrono::steady_clock::now() + timeout;
  std::chrono::steady_clock::time_point began{};
  for (int polls = 0;; ++polls) {
    if (polls == 1) began = std::chrono::steady_clock::now();
    // A long wait gives the core away now and then: with more ranks than cores (or a
    // compute thread beside us) the peer we wait for may need it, and shared-memory
    // rounds advance only when every rank runs (Open MPI's yield_when_idle, for us).
    if (polls >= 256 && (polls & 15) == 0) std::this_thread::yield();
    std::unique_lock lock(mutex_);
    progress_locked();
    if (finished_locked(operation)) {
      if (polls > 0) {
        const auto now = std::chrono::steady_clock::now();
        waited_ns_.fetch_add((now - began).count(), std::memory_order_relaxed);
        blocked_waits_.fetch_add(1, std::memory_order_relaxed);
        if (Tracer* tracer = tracer_.load(std::memory_order_acquire); tracer != nullptr && tracer->recording()) {
          const Collective& c = operation.collective();
          tracer->record(TraceSpan{
              .name = troupe::detail::concat("wait ", collective_name(c.kind)),
              .category = "wait",
              .begin_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(began.time_since_epoch()).count(),
              .end_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
              .thread = Tracer::this_thread_id(),
              .track = {},
              .args = troupe::detail::concat("\"sequence\":", c.sequence, ",\"track\":", json_string(track_))});
        }
      }
      break;
    }
    // Reading the clock costs ~20 ns; poll a few times between reads.
    if (forever || (polls & 7) != 7 || std::chrono::steady_clock::now() < deadline) continue;
    // Name the operation still running: ours, or an earlier one we wait behind.
    const Operation& stuck = operation.done() ? *in_flight_.front() : operation;
    const std::string missing = stuck.waiting_on();
    const std::string message = troupe::detail::concat(
        stuck.collective().describe(), " did not complete within ", format_ms(timeout), " on rank ", rank_, " of ",
        size_, missing.empty() ? "" : " (still waiting for " + missing + ")", "; the communicator is now failed");
    fail_locked(message);
    throw TimeoutError(message);
  }
  if (operation.error_) std::rethrow_exception(operation.error_);
}

void Engine::wait_all(std::chrono::milliseconds timeout) {
  if (in_flight_count_.load(std::memory_order_acquire) == 0) return;
  std::shared_ptr<Operation> last;
  {
    std::lock_guard lock(mutex_);
    if (in_flight_.empty()) return;
    last = in_flight_.back();
  }
  wait(*last, timeout);  // waits for everything launched before it too
}

bool Engine::drain(std::chrono::milliseconds timeout) noexcept {
  const auto deadline =
      timeout == kNoTimeout ? std::chrono::steady_clock::time_point::max() : std::chrono::steady_clock::now() + timeout;
  WaiterScope waiting(waiters_, wake_);
  while (true) {
    {
      std::lock_guard lock(mutex_);
      if (in_flight_.empty()) return abandoned_.empty();
      try {
        progress_locked();
      } catch (...) {
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        fail_locked(troupe::detail::concat("the communicator was destroyed with collectives still in flight after ",
                                           format_ms(timeout)));
        return false;
      }
    }
  }
}

void Engine::fail(const std::string& reason) {
  std::lock_guard lock(mutex_);
  fail_locked(reason);
}

void Engine::fail_locked(const std::string& reason) {
  if (!failed_) {
    failure_ = reason;
    failed_.store(true, std::memory_order_release);
  }
  for (auto& op : in_flight_) {
    finish(*op, std::make_exception_ptr(CommunicatorFailed(troupe::detail::concat(
                    op->collective().describe(), ": abandoned because the communicator failed: ", failure_))));
    abandoned_.push_back(std::move(op));
    troupe::detail::keep_until_exit(this);  // with the abandoned operations and their buffers
  }
  in_flight_.clear();
  in_flight_count_.store(0, std::memory_order_release);
}

std::string Engine::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

bool Engine::has_abandoned() const {
  std::lock_guard lock(mutex_);
  return !abandoned_.empty();
}

void Engine::progress_loop() {
  // Backs off while polling makes no headway: yield first (cheap, keeps latency low),
  // then wait on wake_ for growing intervals up to 200 us, so an idle-but-pending collective
  // (a peer that is late) does not eat a core other ranks may need.
  int idle = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock,
               [&] { return stopping_ || (!in_flight_.empty() && waiters_.load(std::memory_order_acquire) == 0); });
    if (stopping_) return;
    const std::size_t before = in_flight_.size();
    try {
      progress_locked();
    } catch (...) {
    }
    idle = in_flight_.size() < before ? 0 : idle + 1;
    if (idle < 64) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      // MPI offers nothing to block on, so poll again after a pause; a stop, a new
      // launch or a waiter taking over (each notifies wake_) ends the pause at once.
      wake_.wait_for(lock, std::chrono::microseconds(std::min(200, idle - 63)));
    }
  }
}

}  // namespace troupe::collectives::detail
