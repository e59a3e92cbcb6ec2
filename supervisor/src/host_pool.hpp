// HostPool: the hosts of a job across its launches -- which ranks ran where, the
// failures blamed on each host, the hosts left out, and so how many ranks the next
// launch has and on which hosts.
//
// A failure that names a rank (lost, silent, stuck) is blamed on the host that rank
// ran on. A launch that fails before all of its ranks registered names no one; it is
// blamed on the host blamed last, if any: a node that just died is the likely reason
// the relaunch onto it fails (mpirun cannot start its daemon there). After
// `exclude_after` failures a host is left out. The next launch keeps -np when the
// remaining hosts have the slots, else shrinks to what they hold, and is refused below
// `min_ranks`. A host that comes back (troupe-run's --regrow probes it) is readmitted
// with a clean record, and the job grows back towards -np.
//
// Only troupe-run's thread uses it; no locks.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "job_hosts.hpp"

namespace troupe::supervisor {

class HostPool {
 public:
  HostPool(JobHosts hosts, int np, int exclude_after, int min_ranks);

  // A new launch begins: the ranks of the last one are forgotten.
  void begin_launch();
  void rank_registered(int rank, const std::string& host);
  // Blames a failure on `host` (empty: the host blamed last); returns the host
  // blamed, or empty when there is none.
  std::string blame(const std::string& host);

  struct Plan {
    int np = 0;
    std::vector<std::string> excluded_now;  // hosts left out by this plan
    std::string refusal;                    // non-empty: the job cannot go on, and why
  };
  // Leaves out every host blamed exclude_after times, and says what the next launch is.
  Plan plan_next_launch();

  // Takes a left-out host back: its failures are forgotten, and the next launch has as
  // many ranks as the hosts in use hold, up to the -np asked for. Returns that number.
  int readmit(const std::string& host);
  const std::vector<std::string>& excluded() const { return excluded_; }

  int np() const { return np_; }
  bool hosts_changed() const { return !excluded_.empty(); }
  // The hosts still in use, with slots: the ranks each held in the last launch where
  // every rank registered, else the slots given.
  std::vector<JobHost> remaining() const;
  int failures_of(const std::string& host) const;
  // Writes remaining() as an Open MPI hostfile. Throws troupe::Error when it cannot.
  void write_hostfile(const std::string& path) const;
  // "--hostfile F" or the like, for messages.
  const std::string& source() const { return hosts_.source; }

 private:
  JobHosts hosts_;
  int np_wanted_;  // -np
  int np_;         // the next launch's
  int exclude_after_;
  int min_ranks_;
  std::vector<std::string> excluded_;
  std::map<std::string, int> failures_;
  std::map<int, std::string> launch_ranks_;    // rank -> host in this launch
  std::map<std::string, int> ranks_per_host_;  // of the last launch where every rank registered
  std::string last_blamed_;
};

}  // namespace troupe::supervisor
