#include "hang_report.hpp"

#include <algorithm>
#include <optional>

#include "event_log.hpp"
#include "fixed.hpp"

namespace troupe::supervisor {

Phase deadline_phase(const std::vector<RankStatus>& ranks, const RunOptions& options) {
  Phase phase = Phase::training;
  for (const auto& rank : ranks)
    if (rank.registered && phase_timeout(options, rank.progress.phase) > phase_timeout(options, phase))
      phase = rank.progress.phase;
  return phase;
}

HangReport describe_hang(const std::vector<RankStatus>& ranks, Clock::time_point now, Seconds timeout, Phase phase) {
  HangReport report;
  std::string& detail = report.detail;
  detail = "no progress for " + fixed(timeout.count(), 2) + " s in " + std::string(phase_name(phase)) + ":";
  std::optional<std::uint64_t> low, high;
  JsonFields none;
  std::string json = "[";
  for (const auto& rank : ranks) {
    if (!rank.registered) continue;
    const Heartbeat& p = rank.progress;
    double stalled = std::chrono::duration<double>(now - rank.last_progress).count();
    detail += " rank " + std::to_string(rank.rank);
    detail += p.has_step ? " at step " + std::to_string(p.step) : " before its first step";
    if (p.has_sequence) {
      detail += " in collective " + std::to_string(p.sequence);
      low = std::min(low.value_or(p.sequence), p.sequence);
      high = std::max(high.value_or(0), p.sequence);
    }
    detail += " (" + std::string(phase_name(p.phase)) + (rank.host.empty() ? "" : " on " + rank.host) + ", still for " +
              fixed(stalled, 2) + " s);";
    json +=
        std::string(json.size() > 1 ? ", " : "") +
        json_object({{"rank", rank.rank},
                     {"step", p.has_step ? Json(static_cast<unsigned long>(p.step)) : Json::raw("null")},
                     {"collective", p.has_sequence ? Json(static_cast<unsigned long>(p.sequence)) : Json::raw("null")},
                     {"stalled_s", stalled},
                     {"phase", std::string(phase_name(p.phase))},
                     {"host", rank.host}});
  }
  report.ranks_json = json + "]";
  if (low && high && *low < *high) {
    detail += " behind:";
    for (const auto& rank : ranks)
      if (rank.registered && rank.progress.has_sequence && rank.progress.sequence == *low) {
        detail += " rank " + std::to_string(rank.rank);
        report.behind.push_back(rank.rank);
      }
    detail += " (never entered collective " + std::to_string(*low + 1) + ")";
  } else if (detail.back() == ';') {
    detail.pop_back();
  }
  return report;
}

}  // namespace troupe::supervisor
