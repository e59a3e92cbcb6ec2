// `troupe-run status DIR`: the live view of a running job's actors. Each rank's
// runtime writes its list to DIR/troupe-run-status/rank-<r>.json about once a second
// (TROUPE_STATUS_DIR, which troupe-run exports); this reads them and prints one table.
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace troupe::supervisor {

struct ActorStatus {
  std::string label, state, running;  // running: the methods running now, or empty
  double running_for_s = 0;
  std::uint64_t mailbox_depth = 0, calls_served = 0;
  int restarts = 0;
};
struct RankSnapshot {
  int rank = -1;
  std::string host;
  long long time = 0;  // when the rank wrote it (Unix seconds)
  bool finished = false;
  std::vector<ActorStatus> actors;
};

// Where the ranks of a job run with --checkpoint-dir DIR write their status.
std::string status_dir(const std::string& checkpoint_dir);

// Removes the ranks' snapshots of an earlier launch (a relaunch on fewer ranks would
// leave the lost ranks' files behind).
void clear_status(const std::string& checkpoint_dir);

// Every rank's snapshot in `dir` (a job's --checkpoint-dir, or the status folder
// itself), in rank order. A file that is not a snapshot is left out and named in
// `problems`, as is a folder that cannot be read.
std::vector<RankSnapshot> read_status(const std::string& dir, std::vector<std::string>& problems);

// Prints the table for the job whose --checkpoint-dir is `dir` (or the status folder
// itself). A snapshot older than `stale` from a rank still running is flagged: the
// rank may be stuck or gone. Returns 0, or 1 when there is no status to show
// (saying why on `out`).
int print_status(const std::string& dir, std::ostream& out, std::chrono::seconds stale = std::chrono::seconds(5));

}  // namespace troupe::supervisor
