// A rank's dump: what it was doing when troupe-run asked (a hang verdict, or SIGUSR1
// to troupe-run). One text file per rank, DIR/troupe-run-dumps/rank-<r>.txt under the
// job's --checkpoint-dir, replaced whole at each request:
//
//   troupe rank dump: rank 1 of 4, pid 4242, host node2, restart 0, step 12
//   == collectives (oldest first; the flight recorder) ==
//   allreduce #11 (sum, 10 x f32 = 40 B): started 0.804 s ago, done
//   allreduce #12 (sum, 10 x f32 = 40 B): in flight for 1.603 s
//   == threads ==
//   <eu-stack -p PID: every thread's stack, symbolised (elfutils' libdw)>
//
// troupe-run reads the files back and prints one line per rank (dump_summary.hpp).
// A rank that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) writes crash-rank-<r>.txt
// the same way from its signal handler before it dies; troupe-run's failure names it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace troupe::supervisor {

std::string dump_folder(const std::string& checkpoint_dir);
std::string dump_path(const std::string& checkpoint_dir, int rank);
// A rank's dump as it crashed (SupervisorClient's crash handler): the same file, with
// a second header line "crashed: SIGSEGV (address 0x0) in thread 4321".
std::string crash_dump_path(const std::string& checkpoint_dir, int rank);

// Writes the dump file: `header`, the flight record's lines, then every thread's stack
// from eu-stack (or gdb when it is missing), which gets at most `stack_timeout`.
// Written beside and renamed, so a reader sees a whole file or the previous one.
// Returns an empty string, or what went wrong (the rank goes on either way).
std::string write_rank_dump(const std::string& path, const std::string& header, const std::vector<std::string>& flight,
                            std::chrono::milliseconds stack_timeout = std::chrono::seconds(5));

}  // namespace troupe::supervisor
