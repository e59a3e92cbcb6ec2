// `troupe-run status DIR`: the live view of a running job's actors. Each rank's
// runtime writes its list to DIR/troupe-run-status/rank-<r>.json about once a second
// (TROUPE_STATUS_DIR, which troupe-run exports); this reads them and prints one table.
#pragma once

#include <chrono>
#include <ostream>
#include <string>

namespace troupe::supervisor {

// Where the ranks of a job run with --checkpoint-dir DIR write their status.
std::string status_dir(const std::string& checkpoint_dir);

// Removes the ranks' snapshots of an earlier launch (a relaunch on fewer ranks would
// leave the lost ranks' files behind).
void clear_status(const std::string& checkpoint_dir);

// Prints the table for the job whose --checkpoint-dir is `dir` (or the status folder
// itself). A snapshot older than `stale` from a rank still running is flagged: the
// rank may be stuck or gone. Returns 0, or 1 when there is no status to show
// (saying why on `out`).
int print_status(const std::string& dir, std::ostream& out, std::chrono::seconds stale = std::chrono::seconds(5));

}  // namespace troupe::supervisor
