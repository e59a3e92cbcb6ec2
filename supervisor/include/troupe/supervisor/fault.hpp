// Fault injection for tests and demos of troupe-run: TROUPE_FAULT names a rank, a step
// and what goes wrong there.
//
//   TROUPE_FAULT=rank=1,step=37,kind=crash            every launch
//   TROUPE_FAULT=rank=0,step=37,kind=hang,restart=0   only on the first launch
//
// Only when armed: TROUPE_FAULT_ARMED=1 beside it, or troupe-run --fault SPEC, which
// sets both for the job. Rank 0 announces an armed fault at start.
//
//   crash  the process kills itself with SIGKILL (as the OOM killer would): no
//          destructor runs, its heartbeat connection closes without goodbye
//   hang   the calling thread sleeps forever; other threads (the heartbeat) go on,
//          so troupe-run sees a live rank that makes no progress
//   throw  throws FaultInjected, which a program normally lets escape
//   segv   writes to a page mapped with no access: a real SIGSEGV, which leaves a crash dump
//          (rank_dump.hpp) under troupe-run with a checkpoint folder
//   crash_in_save
//          SIGKILL in the middle of writing the checkpoint of that step, after its
//          first tensor is in the temporary file (the rank must be the one that
//          writes, and the step one it saves at); the resume must use the one before
//
// The training loop calls FaultInjector::at_step(step) once per step, before the
// step's collectives; when no fault is set that is one branch. crash_in_save is fired
// by the checkpoint's write observer instead: fires_in_save(step), then fire().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "troupe/error.hpp"

namespace troupe::supervisor {

enum class FaultKind { crash, hang, throw_error, crash_in_save, segv };

struct FaultPlan {
  int rank = 0;
  std::uint64_t step = 0;
  FaultKind kind = FaultKind::crash;
  std::optional<std::uint32_t> restart;  // fire only on this launch; every launch when empty
};

// What kind=throw throws.
class FaultInjected : public Error {
 public:
  using Error::Error;
};

// Parses "rank=1,step=37,kind=crash[,restart=0]" (keys in any order, each once; rank,
// step and kind required). Throws InvalidArgument quoting the text and naming the bad part.
FaultPlan parse_fault(std::string_view text);

class FaultInjector {
 public:
  // No fault: at_step does nothing.
  FaultInjector() = default;
  // `plan` fires on `rank` at its step when `restart` (this launch's TROUPE_RESTART)
  // matches plan.restart, or always when plan.restart is empty.
  FaultInjector(std::optional<FaultPlan> plan, int rank, std::uint32_t restart);
  // From TROUPE_FAULT (unset or empty: no fault) and TROUPE_RESTART, when
  // TROUPE_FAULT_ARMED=1 (else the fault is ignored, with a line on rank 0's stderr).
  // An armed fault is announced on rank 0's stderr. Throws InvalidArgument naming the
  // variable when either is malformed.
  static FaultInjector from_environment(int rank);

  bool armed() const { return armed_; }
  // Fires the fault if this is its step; otherwise returns at once.
  void at_step(std::uint64_t step) const {
    if (armed_ && step == plan_.step && plan_.kind != FaultKind::crash_in_save) fire();
  }
  // Whether a crash_in_save fault is due while writing the checkpoint of `step`.
  bool fires_in_save(std::uint64_t step) const {
    return armed_ && step == plan_.step && plan_.kind == FaultKind::crash_in_save;
  }
  // Logs the fault on stderr and carries it out (never returns).
  [[noreturn]] void fire() const;

 private:
  FaultPlan plan_;
  bool armed_ = false;
};

}  // namespace troupe::supervisor
