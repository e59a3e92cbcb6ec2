#include "host_pool.hpp"

#include <algorithm>
#include <fstream>

#include "troupe/error.hpp"

namespace troupe::supervisor {

HostPool::HostPool(JobHosts hosts, int np, int exclude_after, int min_ranks)
    : hosts_(std::move(hosts)),
      np_wanted_(np),
      np_(np),
      exclude_after_(exclude_after),
      min_ranks_(min_ranks > 0 ? min_ranks : np) {}

void HostPool::begin_launch() { launch_ranks_.clear(); }

void HostPool::rank_registered(int rank, const std::string& host) {
  launch_ranks_[rank] = host;
  if (static_cast<int>(launch_ranks_.size()) != np_) return;
  ranks_per_host_.clear();
  for (const auto& [r, h] : launch_ranks_) ++ranks_per_host_[h];
}

std::string HostPool::blame(const std::string& host) {
  std::string blamed = host.empty() ? last_blamed_ : host;
  if (blamed.empty()) return {};
  ++failures_[blamed];
  last_blamed_ = blamed;
  return blamed;
}

int HostPool::failures_of(const std::string& host) const {
  auto found = failures_.find(host);
  return found == failures_.end() ? 0 : found->second;
}

std::vector<JobHost> HostPool::remaining() const {
  std::vector<JobHost> left;
  for (const auto& host : hosts_.hosts) {
    if (std::find(excluded_.begin(), excluded_.end(), host.name) != excluded_.end()) continue;
    JobHost h = host;
    if (auto seen = ranks_per_host_.find(host.name); seen != ranks_per_host_.end())
      h.slots = std::max(h.slots, seen->second);
    left.push_back(h);
  }
  return left;
}

void HostPool::write_hostfile(const std::string& path) const {
  std::ofstream out(path, std::ios::trunc);
  out << "# written by troupe-run: " << hosts_.source << " without the hosts left out\n";
  for (const auto& host : remaining())
    out << host.name << (host.slots > 0 ? " slots=" + std::to_string(host.slots) : "") << "\n";
  out.close();
  if (!out) TROUPE_THROW(Error, "troupe-run: cannot write the hostfile ", path);
}

int HostPool::readmit(const std::string& host) {
  auto out = std::find(excluded_.begin(), excluded_.end(), host);
  if (out == excluded_.end()) return np_;
  excluded_.erase(out);
  failures_.erase(host);
  if (last_blamed_ == host) last_blamed_.clear();
  const auto left = remaining();
  const bool all_known = std::all_of(left.begin(), left.end(), [](const JobHost& h) { return h.slots > 0; });
  int slots = 0;
  for (const auto& h : left) slots += h.slots;
  np_ = excluded_.empty() || !all_known ? np_wanted_ : std::min(np_wanted_, slots);
  return np_;
}

HostPool::Plan HostPool::plan_next_launch() {
  Plan plan;
  if (exclude_after_ > 0) {
    for (const auto& host : hosts_.hosts) {
      bool out = std::find(excluded_.begin(), excluded_.end(), host.name) != excluded_.end();
      if (!out && failures_of(host.name) >= exclude_after_) {
        excluded_.push_back(host.name);
        plan.excluded_now.push_back(host.name);
      }
    }
  }
  if (!plan.excluded_now.empty()) {
    auto left = remaining();
    if (left.empty()) {
      plan.refusal = "every host of " + hosts_.source + " has been left out";
    } else {
      bool all_known = std::all_of(left.begin(), left.end(), [](const JobHost& h) { return h.slots > 0; });
      int slots = 0;
      for (const auto& h : left) slots += h.slots;
      int lost = 0;  // ranks the left-out hosts held, when known
      for (const auto& name : plan.excluded_now)
        if (auto seen = ranks_per_host_.find(name); seen != ranks_per_host_.end()) lost += seen->second;
      int np = all_known ? std::min(np_, slots) : np_ - lost;
      if (np < min_ranks_)
        plan.refusal =
            "the hosts left hold " + std::to_string(np) + " rank(s), below --min-ranks " + std::to_string(min_ranks_);
      else
        np_ = np;
    }
  }
  plan.np = np_;
  return plan;
}

}  // namespace troupe::supervisor
