// troupe-run's command line:
//
//   troupe-run -np N [--max-restarts K] [--checkpoint-dir DIR] [--hang-timeout S]
//              [--heartbeat-timeout S] [--backoff S] [--grace S] [--bind ADDR:PORT]
//              [--events FILE] [--metrics ADDR:PORT] [mpirun options] -- program args...
//
// mpirun options that troupe-run knows pass through unchanged (--hostfile F, --host H,
// --mca K V, -x VAR, --map-by X, --bind-to X, --oversubscribe, ...); anything else
// before `--` is an error, so a typo is not silently handed to mpirun.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "troupe/supervisor/protocol.hpp"

namespace troupe::supervisor {

using Seconds = std::chrono::duration<double>;

struct RunOptions {
  int np = 0;
  // Relaunches after a failure before troupe-run gives up (0: never relaunch).
  int max_restarts = 3;
  // Exported as TROUPE_CHECKPOINT_DIR (made absolute, created if missing); empty: none.
  std::string checkpoint_dir;
  // A rank whose (step, collective) has not changed for this long is stuck: a hang.
  // Below the collectives' own timeout (5 min, whose watchdog aborts the job), so a
  // hang is reported with every rank's position before that abort hides it.
  Seconds hang_timeout{180};
  // Deadlines of the other phases (protocol.hpp), from --phase-timeout NAME=S; a phase
  // not named gets phase_timeout()'s default.
  std::map<Phase, Seconds> phase_timeouts;
  // A connected rank not heard from for this long is dead even if its socket is open
  // (a stopped process, a partitioned node: no FIN ever comes). Ranks heartbeat every
  // 0.1 s from a thread of their own, so 1.5 s is 15 missed beats, and a silent node is
  // caught within 2 s instead of a TCP timeout's minutes. Ranks fence themselves after
  // the same time without an answer (SupervisorClient).
  Seconds heartbeat_timeout{1.5};
  // How long ranks wait to hear from each other before calling a peer lost (the actors'
  // liveness ring, 1 s by default), exported as TROUPE_LIVENESS_TIMEOUT_MS; 0: the
  // program's own setting. Raise it with heartbeat_timeout where nodes can be slow
  // without being dead.
  Seconds liveness_timeout{0};
  // Wait before relaunch n: backoff * 2^(n-1), at most 60 s; lets a flaky node or port recover.
  Seconds backoff{1};
  // SIGTERM to SIGKILL when stopping the job: time for ranks to exit on their own.
  Seconds grace{3};
  // Where the heartbeat server listens; empty: chosen by troupe-run -- loopback when
  // every rank runs on this host, every interface when the job names other hosts
  // (job_hosts.hpp). Port 0: any free port.
  std::string bind_host;
  unsigned short bind_port = 0;
  // --metrics: where troupe-run serves Prometheus metrics (metrics_server.hpp); off
  // unless given.
  bool metrics = false;
  std::string metrics_host;
  unsigned short metrics_port = 0;
  // The address ranks are told to connect to; empty: the bind address, or, bound to
  // every interface with ranks on other hosts, this host's address on the route to them.
  std::string advertise;
  // A host blamed for this many failures is left out of the next launches (0: never).
  // The job then runs on the remaining hosts: with as many ranks as before when they
  // have the slots, else with fewer, down to min_ranks (elastic shrink).
  int exclude_after = 0;
  // The fewest ranks a relaunch may have after hosts were left out; 0: -np (no shrink).
  int min_ranks = 0;
  // Grow back onto a host that was left out once it answers again: troupe-run probes
  // such hosts every probe_interval (`mpirun --host H -np 1 true`, through the same
  // launcher), and after the next checkpoint that appears stops the job and relaunches
  // it on every host with -np ranks; the program resumes resharded. Needs checkpoint_dir.
  bool regrow = false;
  Seconds probe_interval{5};
  // A launch that fails before its ranks registered, on a host that does not answer
  // (a node down, a link cut): troupe-run waits up to this long for the host, probing
  // it, and the failed launch is not counted against max_restarts. 0: never wait.
  Seconds host_wait{120};
  // After the job stopped on failed saves, a checkpoint folder without room for another
  // checkpoint: troupe-run waits up to this long for room (polling) before giving up,
  // as a disk freed by another job or a cleaner is not the program's failure. 0: never.
  Seconds storage_wait{10};
  // A rank whose own work per step (its step time less its waits in collectives) is at
  // least this many times the ranks' median is reported as a straggler (events log and
  // stderr), without a restart. 0: off.
  double straggler_ratio = 1.5;
  // --fault SPEC: TROUPE_FAULT for the job, armed (fault.hpp); empty: none.
  std::string fault;
  // --trace DIR [--trace-steps FIRST-LAST]: TrainWorker programs write a timeline of
  // those steps to DIR/trace.json (TROUPE_TRACE_DIR, TROUPE_TRACE_STEPS); empty: none.
  std::string trace_dir;
  std::string trace_steps;
  // JSONL events file; empty: <checkpoint-dir>/troupe-run-events.jsonl, or none
  // without a checkpoint directory.
  std::string events_file;
  // mpirun options passed through, in order.
  std::vector<std::string> mpirun_args;
  // The program and its arguments (after `--`).
  std::vector<std::string> program;
  bool help = false;
  bool version = false;  // --version: print it and exit
};

// How long a rank may stay in `phase` without progress: --phase-timeout, else
// --hang-timeout for training, else the longer of --hang-timeout and a default that
// fits the phase (startup 600 s, evaluation and data loading 1800 s, checkpoint save
// and load 3600 s).
Seconds phase_timeout(const RunOptions& options, Phase phase);

// Parses argv (argv[0] excluded). Throws InvalidArgument with a message naming the
// flag and value; troupe-run prints it with usage() and exits with status 2.
RunOptions parse_run_options(const std::vector<std::string>& args);

std::string usage();

}  // namespace troupe::supervisor
