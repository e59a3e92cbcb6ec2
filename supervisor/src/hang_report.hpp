// What troupe-run says when a job hangs: every registered rank's step and the last
// collective it entered, and which ranks are behind. In a job where every rank issues
// the same collectives in the same order, the ranks with the lowest collective number
// never entered the one the others are waiting in: they are the ones to look at (the
// diagnosis PyTorch's flight recorder gives after the fact, given while it happens).
#pragma once

#include <string>
#include <vector>

#include "heartbeat_server.hpp"
#include "run_options.hpp"

namespace troupe::supervisor {

struct HangReport {
  // "no progress for 1.50 s in training: rank 0 at step 12 in collective 12 (training on
  //  node1, still for 1.52 s); rank 1 at step 12 in collective 13 (training on node2, still
  //  for 1.52 s); behind: rank 0 (never entered collective 13)"
  std::string detail;
  // [{"rank": 0, "step": 12, "collective": 12, "stalled_s": 1.52, "phase": "training",
  //   "host": "node1"}, ...] for the events log
  std::string ranks_json;
  // Ranks at the lowest collective number, when the ranks disagree; empty otherwise.
  std::vector<int> behind;
};

// The phase whose deadline the job is held to: the longest of the phases its ranks
// are in. A rank blocked in a collective while a peer writes a ten-minute checkpoint
// is waiting on that peer, not stuck; when every rank trains, the hang timeout rules.
Phase deadline_phase(const std::vector<RankStatus>& ranks, const RunOptions& options);

// `timeout` is the deadline the stuck rank missed, the one of its `phase`.
HangReport describe_hang(const std::vector<RankStatus>& ranks, Clock::time_point now, Seconds timeout,
                         Phase phase = Phase::training);

}  // namespace troupe::supervisor
