// The mpirun command line troupe-run runs for each launch.
#pragma once

#include <string>
#include <vector>

#include "host_pool.hpp"
#include "run_options.hpp"

namespace troupe::supervisor {

// mpirun -np N [--oversubscribe] [pass-through options] -x NAME... program args...
//
// `exported` are variable names whose values troupe-run puts in mpirun's own
// environment: `-x NAME` (no value) forwards them to every rank, local or remote,
// without writing the token into a command line that `ps` shows. --oversubscribe is
// added when N exceeds `cores` and the user named no hosts and no mapping policy of
// their own: a single-node test or demo then runs instead of being refused.
std::vector<std::string> mpirun_command(const RunOptions& options, const std::string& mpirun,
                                        const std::vector<std::string>& exported, unsigned cores);

// The options of the next launch: -np from the pool, and, once hosts were left out, a
// hostfile of the remaining ones (written to `hostfile`) in place of the user's
// --hostfile/--host.
RunOptions launch_options(const RunOptions& options, const HostPool& pool, const std::string& hostfile);

// `mpirun --host HOST -np 1 [the user's launcher options] true`: whether mpirun can
// start a process on HOST again, through the same launcher and agent as the job
// (--regrow's probe). Host and mapping options of the job are left out.
std::vector<std::string> probe_command(const RunOptions& options, const std::string& mpirun, const std::string& host);

}  // namespace troupe::supervisor
