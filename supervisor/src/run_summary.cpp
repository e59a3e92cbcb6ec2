#include "run_summary.hpp"

#include <sstream>

#include "fixed.hpp"

namespace troupe::supervisor {

std::uint64_t RunSummary::Failure::redone() const {
  if (!failed_at_step || !resumed_at_step || *failed_at_step < *resumed_at_step) return 0;
  return *failed_at_step - *resumed_at_step;
}

void RunSummary::failed(std::string cause, std::string detail, std::optional<std::uint64_t> furthest_step,
                        Clock::time_point last_progress, Clock::time_point now) {
  if (!failures_.empty() && !failures_.back().resumed_at_step) {
    Failure& previous = failures_.back();
    previous.lost_s = std::chrono::duration<double>(now - previous.last_progress).count();
    last_progress = now;
  }
  failures_.push_back({std::move(cause), std::move(detail), furthest_step, std::nullopt, last_progress, 0});
}

bool RunSummary::resumed(std::uint64_t step, Clock::time_point now) {
  if (failures_.empty() || failures_.back().resumed_at_step) return false;
  Failure& f = failures_.back();
  f.resumed_at_step = step;
  f.lost_s = std::chrono::duration<double>(now - f.last_progress).count();
  return true;
}

RunSummary::Totals RunSummary::close(Clock::time_point now) {
  if (!failures_.empty() && !failures_.back().resumed_at_step)
    failures_.back().lost_s = std::chrono::duration<double>(now - failures_.back().last_progress).count();
  totals_ = {};
  for (const auto& f : failures_) {
    totals_.lost_s += f.lost_s;
    totals_.steps_redone += f.redone();
    totals_.causes.push_back(f.cause);
  }
  return totals_;
}

std::string RunSummary::text(const std::string& outcome, int restarts, double total_s, int exit_code) const {
  std::ostringstream out;
  out << "summary: " << outcome << " after " << failures_.size() << " failure(s), " << restarts << " restart(s), in "
      << fixed(total_s, 2) << " s (exit status " << exit_code << ")\n";
  for (std::size_t i = 0; i < failures_.size(); ++i) {
    const Failure& f = failures_[i];
    out << "  launch " << i << ": " << f.cause << ": " << f.detail << "\n";
    if (f.resumed_at_step)
      out << "    resumed at step " << *f.resumed_at_step << " (" << f.redone() << " step(s) redone, "
          << fixed(f.lost_s, 2) << " s lost)\n";
  }
  out << "  time lost " << fixed(totals_.lost_s, 2) << " s, steps redone " << totals_.steps_redone;
  return out.str();
}

std::map<std::string, std::uint64_t> RunSummary::causes() const {
  std::map<std::string, std::uint64_t> counts;
  for (const Failure& f : failures_) ++counts[f.cause];
  return counts;
}

}  // namespace troupe::supervisor
