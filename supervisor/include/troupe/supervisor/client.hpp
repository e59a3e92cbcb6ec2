// SupervisorClient: the rank's side of troupe-run's heartbeat protocol (protocol.hpp).
//
// A program started by troupe-run creates one per rank, early (after MPI is up, so it
// knows its rank) and keeps it until it ends:
//
//   auto env = troupe::supervisor::run_environment();
//   auto client = troupe::supervisor::SupervisorClient::connect_if_supervised(env, rank, size);
//   { troupe::supervisor::PhaseScope loading(client.get(), Phase::checkpoint_load); resume(); }
//   for (step...) {
//     if (client) client->report_step(step);             // an atomic store, ~1 ns
//     if (client) client->report_collective(comm.next_sequence());  // before a collective
//     ...
//   }
//   // the destructor says goodbye: a clean exit is not mistaken for a dead rank
//
// The constructor connects, presents the run's token and registers (rank, host, pid);
// it throws troupe::Error naming the address when it cannot, or when troupe-run refuses
// (a wrong token, a rank of an older launch). A connection troupe-run evicted before
// reading its Hello (a flood of silent connections; heartbeat_server.hpp) is tried
// again until the timeout. A background thread then sends the last
// reported progress every heartbeat interval. report_* only store into atomics, so
// they cost nothing next to a training step and may be called from any thread.
//
// Fencing. troupe-run answers every heartbeat. When it sets TROUPE_SUPERVISOR_TIMEOUT_MS
// (it always does), a rank that hears nothing from it for that long, or whose
// connection it closed, stops itself: troupe-run has declared it dead and restarted, or
// will restart, the job without it -- the rank sits behind a partition, or troupe-run
// itself is gone -- and a rank that carried on would be half of a split job, writing
// checkpoints beside the new launch. The default action prints why and SIGKILLs the
// process (what troupe-run would have done, could it reach it); `on_lost` replaces it.
// The same happens when troupe-run sends Stop: that is how it stops ranks on other
// hosts at once, where mpirun takes a second or more to pass a signal on.
// Without the variable, lost heartbeats cost one line on stderr and the program goes on.
//
// Who creates it: the training program (train/ or an example), never actors/ or
// collectives/, which stay ignorant of troupe-run (see docs/ARCHITECTURE.md).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "troupe/supervisor/protocol.hpp"
#include "troupe/supervisor/run_environment.hpp"

namespace troupe::supervisor {

class SupervisorClient {
 public:
  // Connects to env.supervisor and registers as `rank` of `world_size`. Blocks until
  // troupe-run answers (at most `timeout`).
  // `on_lost` runs on the heartbeat thread when the rank fences itself (see above),
  // with the reason; null: print it and SIGKILL this process.
  using LostHandler = std::function<void(const std::string& why)>;
  SupervisorClient(const RunEnvironment& env, int rank, int world_size,
                   std::chrono::milliseconds timeout = std::chrono::seconds(10), LostHandler on_lost = nullptr);
  // A client when env.supervised(), else null: the same program runs with and without
  // troupe-run.
  static std::unique_ptr<SupervisorClient> connect_if_supervised(const RunEnvironment& env, int rank, int world_size);
  SupervisorClient(const SupervisorClient&) = delete;
  SupervisorClient& operator=(const SupervisorClient&) = delete;
  // Says goodbye (close()), unless the destructor runs because an exception is
  // unwinding the stack: then the connection just closes, and troupe-run sees a rank
  // that failed at once instead of waiting for mpirun's exit status. Never throws.
  ~SupervisorClient();

  // The training step the rank is at. Cheap: a relaxed load and store (no
  // read-modify-write, ~1 ns); the first report also wakes the heartbeat thread, so
  // troupe-run learns at once where the launch (re)started, not an interval later.
  void report_step(std::uint64_t step) noexcept {
    bool first = step_.load(std::memory_order_relaxed) == kUnset;
    step_.store(step, std::memory_order_relaxed);
    if (first) {
      if (phase() == Phase::startup) report_phase(Phase::training);
      wake_first_step();
    }
  }
  // What the rank is doing (protocol.hpp): troupe-run holds each phase to its own
  // deadline. A rank starts in `startup` and its first report_step moves it to
  // `training`; PhaseScope marks the others.
  void report_phase(Phase phase) noexcept { phase_.store(static_cast<std::uint8_t>(phase), std::memory_order_relaxed); }
  Phase phase() const noexcept { return static_cast<Phase>(phase_.load(std::memory_order_relaxed)); }
  // The sequence number of the collective the rank is about to enter (call it before
  // the collective, so a rank stuck inside one reports the one it is stuck in).
  void report_collective(std::uint64_t sequence) noexcept { sequence_.store(sequence, std::memory_order_relaxed); }

  // The rank's own work in the step just finished: its wall time less the time spent
  // waiting for peers inside collectives (Communicator::wait_time). Heartbeats carry
  // the running totals; troupe-run compares ranks' work per step to name a straggler.
  // Call from one thread (the training loop's).
  void report_step_work(std::chrono::nanoseconds work) noexcept {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(work).count();
    work_us_.store(work_us_.load(std::memory_order_relaxed) + static_cast<std::uint64_t>(us > 0 ? us : 0),
                   std::memory_order_relaxed);
    work_steps_.store(work_steps_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // Sends a Notice for troupe-run's event log (a failed checkpoint save); dropped when
  // the connection is gone. Never throws.
  void report_notice(NoticeKind kind, const std::string& text) noexcept;

  // What this rank's dump lists under collectives (Communicator::flight_record): called
  // from the heartbeat thread when troupe-run asks for a dump (rank_dump.hpp), while
  // the training thread may be stuck, so it must not wait for that thread.
  void set_flight_recorder(std::function<std::vector<std::string>()> record);

  // Stops heartbeating, sends Goodbye and closes: the rank is ending on purpose.
  // Idempotent; never throws.
  void close() noexcept;
  // Closes without goodbye: troupe-run treats this rank as failed right away. A
  // non-empty `why` (the error the rank fails with) goes first as a Notice, and the
  // failure troupe-run reports quotes it.
  void abandon(std::string_view why = {}) noexcept;

  // Writes this rank's crash dump (crash_dump_path: the header says which signal, at
  // which address, on which thread). Called by the crash handler the first client with
  // a checkpoint folder installs for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT, on the
  // crashing thread; the handler then lets the signal end the process as before (or
  // passes it to the handler that was there: a sanitizer's). Best effort: it allocates,
  // so a crash inside malloc may leave it stuck, and an alarm ends it after 15 s.
  void write_crash_dump(int signal, const void* address) noexcept;

  // Heartbeats sent so far (for tests and the overhead benchmark).
  std::uint64_t heartbeats_sent() const { return sent_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uint64_t kUnset = ~std::uint64_t{0};
  void heartbeat_loop();
  void wake_first_step() noexcept;
  // Reads troupe-run's answers without blocking; empty while it is heard, else why not.
  std::string check_answers();
  void lose_supervisor(const std::string& why);
  // Connects and says Hello once: "" when welcomed, else why not (fd_ closed again);
  // `evicted` is set when troupe-run evicted the connection (worth another try).
  std::string register_once(const Hello& hello, std::chrono::milliseconds timeout, bool& evicted);
  void discard_answers(std::chrono::milliseconds linger) noexcept;
  bool send_frame(const std::vector<std::uint8_t>& frame) noexcept;

  // Writes this rank's dump file (troupe-run sent Dump).
  void write_dump() noexcept;
  std::string dump_header() const;
  void install_crash_handler() noexcept;
  void remove_crash_handler() noexcept;

  std::string address_;
  std::string checkpoint_dir_;  // where dumps go; empty: none
  int rank_ = 0, world_size_ = 0;
  std::uint32_t restart_ = 0;
  std::mutex recorder_mutex_;
  std::function<std::vector<std::string>()> flight_recorder_;
  int fd_ = -1;
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds supervisor_timeout_;
  LostHandler on_lost_;
  std::chrono::steady_clock::time_point last_answer_;
  std::vector<std::uint8_t> answers_;  // troupe-run's frames, read but not yet whole
  std::atomic<std::uint64_t> step_{kUnset};
  std::atomic<std::uint64_t> sequence_{kUnset};
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> work_us_{0};
  std::atomic<std::uint64_t> work_steps_{0};
  std::atomic<std::uint8_t> phase_{static_cast<std::uint8_t>(Phase::startup)};
  std::mutex mutex_;  // guards stop_ and the socket's writes
  std::condition_variable wake_;
  bool stop_ = false;
  bool first_step_ = false;  // a first step was reported and not yet sent
  std::thread thread_;
  int uncaught_at_start_ = 0;  // std::uncaught_exceptions() when constructed
};

// Reports `phase` for as long as it lives, then the phase before it. A null client (not
// under troupe-run) makes it do nothing, so callers need no `if`.
class PhaseScope {
 public:
  PhaseScope(SupervisorClient* client, Phase phase) noexcept
      : client_(client), before_(client ? client->phase() : Phase::startup) {
    if (client_) client_->report_phase(phase);
  }
  ~PhaseScope() {
    if (client_) client_->report_phase(before_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  SupervisorClient* client_;
  Phase before_;
};

}  // namespace troupe::supervisor
