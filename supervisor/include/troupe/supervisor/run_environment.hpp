// What troupe-run tells every rank, through environment variables (exported with
// mpirun -x, so they reach ranks on other nodes too):
//
//   TROUPE_SUPERVISOR             host:port of troupe-run's heartbeat server
//   TROUPE_RUN_TOKEN              the run's random token; a connection must present it
//   TROUPE_RUN_ID                 the run's id (the same across restarts)
//   TROUPE_RESTART                0 on the first launch, 1 after the first restart, ...
//   TROUPE_CHECKPOINT_DIR         where the program saves and resumes (absolute path)
//   TROUPE_CHECKPOINT_STEP        the newest checkpoint troupe-run saw there at this
//                                 launch (unset: none): a rank that finds none must not
//                                 start over (it sees another folder: a node-local path?)
//   TROUPE_HEARTBEAT_INTERVAL_MS  how often the rank should heartbeat
//   TROUPE_SUPERVISOR_TIMEOUT_MS  a rank that hears nothing from troupe-run for this
//                                 long stops itself (SupervisorClient's fencing); unset: never
//
// A program reads them once, at start, with run_environment(); troupe-run writes them
// for each launch with launch_environment(). Outside troupe-run none is set and the
// defaults say so (supervised() is false).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::supervisor {

inline constexpr const char* kEnvSupervisor = "TROUPE_SUPERVISOR";
inline constexpr const char* kEnvRunToken = "TROUPE_RUN_TOKEN";
inline constexpr const char* kEnvRunId = "TROUPE_RUN_ID";
inline constexpr const char* kEnvRestart = "TROUPE_RESTART";
inline constexpr const char* kEnvCheckpointDir = "TROUPE_CHECKPOINT_DIR";
inline constexpr const char* kEnvCheckpointStep = "TROUPE_CHECKPOINT_STEP";
inline constexpr const char* kEnvHeartbeatInterval = "TROUPE_HEARTBEAT_INTERVAL_MS";
inline constexpr const char* kEnvSupervisorTimeout = "TROUPE_SUPERVISOR_TIMEOUT_MS";
inline constexpr const char* kEnvFault = "TROUPE_FAULT";
// TROUPE_FAULT is obeyed only when this is "1" (troupe-run --fault sets both): a
// variable left in a shell must never kill a production run.
inline constexpr const char* kEnvFaultArmed = "TROUPE_FAULT_ARMED";
// Read by actors::Runtime: how long a rank may be silent before its peers call it lost.
inline constexpr const char* kEnvLivenessTimeout = "TROUPE_LIVENESS_TIMEOUT_MS";
// Read by actors::Runtime: the folder where each rank writes its actors' live state
// (set to DIR/troupe-run-status with --checkpoint-dir DIR; `troupe-run status DIR`).
inline constexpr const char* kEnvStatusDir = "TROUPE_STATUS_DIR";
// troupe-run --trace DIR and --trace-steps FIRST-LAST, for TrainWorker's StepTrace.
inline constexpr const char* kEnvTraceDir = "TROUPE_TRACE_DIR";
inline constexpr const char* kEnvTraceSteps = "TROUPE_TRACE_STEPS";

struct RunEnvironment {
  std::string supervisor;  // "host:port", empty when not under troupe-run
  std::string token;
  std::string run_id;
  std::uint32_t restart = 0;
  std::string checkpoint_dir;  // empty when troupe-run was given none
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds supervisor_timeout{0};  // 0: never fence
  std::string fault;                                // troupe-run --fault: set as TROUPE_FAULT, armed; empty: none
  long long checkpoint_step = -1;                   // the newest checkpoint troupe-run saw at launch; -1: none
  std::string trace_dir;                            // troupe-run --trace; empty: none
  std::string trace_steps;                          // --trace-steps; empty: the program's default

  bool supervised() const { return !supervisor.empty(); }
};

// Reads the variables above. Throws InvalidArgument naming the variable and its value
// when one is set but malformed (a restart count that is not a number, say), or when
// TROUPE_SUPERVISOR is set without TROUPE_RUN_TOKEN.
RunEnvironment run_environment();

// A new run's id, "20261126T223526Z-3fa9c1" (UTC start time, 3 random bytes: sortable
// and unique enough to name files), and its token (16 bytes from the kernel's CSPRNG,
// in hex), which a rank must present to the heartbeat server.
std::string new_run_id();
std::string new_run_token();

// What troupe-run sets for one launch of mpirun: `run` as the variables above (what
// run_environment() reads back), TROUPE_LIVENESS_TIMEOUT_MS when `liveness_timeout`
// is not 0, Open MPI's run-as-root pair when troupe-run is root; and the names mpirun
// must export to every node (-x): those of troupe, and every TROUPE_*, OPENBLAS_* and
// OMP_* variable of troupe-run's own environment (TROUPE_FAULT, the BLAS kernels), so
// that a rank computes the same bits on whichever node it lands.
struct LaunchEnvironment {
  std::vector<std::pair<std::string, std::string>> variables;
  std::vector<std::string> exported;
};
LaunchEnvironment launch_environment(const RunEnvironment& run, std::chrono::milliseconds liveness_timeout);

}  // namespace troupe::supervisor
