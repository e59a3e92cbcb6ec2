// The hosts a job runs on, as mpirun will see them: the --host list, the --hostfile,
// or the Slurm allocation troupe-run runs inside. troupe-run needs them to choose a
// heartbeat address every rank can reach (a loopback one cannot serve ranks on other
// hosts), to reject a host that does not resolve before anything is launched, and to
// leave out a node that keeps failing (RunOptions::exclude_after).
#pragma once

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "run_options.hpp"

namespace troupe::supervisor {

struct JobHost {
  std::string name;
  int slots = 0;  // 0: not given (mpirun then counts the host's cores)
};

struct JobHosts {
  std::vector<JobHost> hosts;  // in the order given; empty: this host only
  std::string source;          // "--hostfile F", "--host", "the Slurm allocation", or ""
};

// Reads --hostfile (lines "name [slots=N] ...", '#' comments) or --host
// ("a,b:2,c"), else SLURM_JOB_NODELIST through `getenv`. Throws InvalidArgument
// naming the file and line for an unreadable or malformed hostfile.
JobHosts job_hosts(
    const RunOptions& options,
    const std::function<const char*(const char*)>& getenv = [](const char* n) { return std::getenv(n); });

// Slurm's compressed host list: "node[1-3,07],login" -> node1 node2 node3 node07 login.
// Throws InvalidArgument on unbalanced brackets or a bad range.
std::vector<std::string> expand_hostlist(const std::string& list);

// True for "localhost", this machine's own host name, and names that resolve to a
// loopback address: ranks there share troupe-run's loopback.
bool is_this_host(const std::string& name);

// The address this host would send from to reach `host` (a connected UDP socket's
// own address; nothing is sent). Throws InvalidArgument naming the host when it does
// not resolve or no route leads to it.
std::string route_source_address(const std::string& host);

// Fills in where the heartbeat server listens and what ranks are told, from the job's
// hosts. Ranks on other hosts can reach neither a loopback address nor this host's
// name when it resolves to one (as Debian's /etc/hosts makes it), so with remote hosts
// and no --bind troupe-run listens on every interface and advertises its address on
// the route to them (unless --advertise says otherwise). Throws InvalidArgument, before anything is launched,
// for a loopback --bind with remote ranks and for a host that does not resolve or has
// no route.
void choose_heartbeat_address(RunOptions& options, const JobHosts& hosts);

}  // namespace troupe::supervisor
