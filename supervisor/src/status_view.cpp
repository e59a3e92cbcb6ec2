#include "status_view.hpp"

#include <algorithm>
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <ctime>
#include <filesystem>
#include <vector>

#include "fixed.hpp"

namespace troupe::supervisor {

namespace fs = std::filesystem;

std::string status_dir(const std::string& checkpoint_dir) { return checkpoint_dir + "/troupe-run-status"; }

void clear_status(const std::string& checkpoint_dir) {
  std::error_code error;
  for (fs::directory_iterator it(status_dir(checkpoint_dir), error), end; !error && it != end; it.increment(error))
    if (it->path().filename().string().starts_with("rank-")) fs::remove(it->path(), error);
}

namespace {

void print_row(std::ostream& out, const std::vector<std::string>& cells, const std::vector<std::size_t>& widths) {
  for (std::size_t i = 0; i < cells.size(); ++i) {
    out << cells[i];
    if (i + 1 < cells.size()) out << std::string(widths[i] - cells[i].size() + 2, ' ');
  }
  out << "\n";
}

}  // namespace

std::vector<RankSnapshot> read_status(const std::string& dir, std::vector<std::string>& problems) {
  fs::path folder = dir;
  if (fs::is_directory(status_dir(dir))) folder = status_dir(dir);
  std::vector<RankSnapshot> snapshots;
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("rank-") || !name.ends_with(".json")) continue;
    RankSnapshot s;
    try {
      boost::property_tree::ptree tree;
      boost::property_tree::read_json(it->path().string(), tree);
      s.rank = tree.get<int>("rank");
      s.host = tree.get<std::string>("host", "");
      s.time = tree.get<long long>("time", 0);
      s.finished = tree.get<bool>("finished", false);
      if (auto actors = tree.get_child_optional("actors")) {
        for (const auto& [key, a] : *actors)
          s.actors.push_back(ActorStatus{.label = a.get<std::string>("label", "?"),
                                         .state = a.get<std::string>("state", "?"),
                                         .running = a.get<std::string>("running", ""),
                                         .running_for_s = a.get<double>("running_for_s", 0),
                                         .mailbox_depth = a.get<std::uint64_t>("mailbox_depth", 0),
                                         .calls_served = a.get<std::uint64_t>("calls_served", 0),
                                         .restarts = a.get<int>("restarts", 0)});
      }
    } catch (const std::exception& e) {  // a rank's file from another version, or damaged: say so, keep the rest
      problems.push_back(it->path().string() + " is not a status snapshot (" + e.what() + ")");
      continue;
    }
    snapshots.push_back(std::move(s));
  }
  if (error) problems.push_back("cannot read " + folder.string() + " (" + error.message() + ")");
  std::sort(snapshots.begin(), snapshots.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return snapshots;
}

int print_status(const std::string& dir, std::ostream& out, std::chrono::seconds stale) {
  const fs::path folder = fs::is_directory(status_dir(dir)) ? fs::path(status_dir(dir)) : fs::path(dir);
  std::vector<std::string> problems;
  const std::vector<RankSnapshot> snapshots = read_status(dir, problems);
  for (const auto& problem : problems) out << "troupe-run status: " << problem << "\n";
  if (snapshots.empty()) {
    out << "troupe-run status: no status in " << folder.string()
        << "; the job writes it there when run by troupe-run with --checkpoint-dir\n";
    return 1;
  }
  const long long now = std::time(nullptr);
  std::vector<std::vector<std::string>> rows = {
      {"rank", "host", "actor", "state", "mailbox", "running", "served", "restarts"}};
  std::vector<std::string> notes;
  for (const RankSnapshot& s : snapshots) {
    const long long age = now - s.time;
    if (s.finished)
      notes.push_back("rank " + std::to_string(s.rank) + " has finished (its runtime shut down)");
    else if (age > stale.count())
      notes.push_back("rank " + std::to_string(s.rank) + "'s snapshot is " + std::to_string(age) +
                      " s old: the rank may be stuck or gone");
    for (const ActorStatus& a : s.actors) {
      const std::string running = a.running.empty() ? "-" : a.running + " for " + fixed(a.running_for_s, 1) + " s";
      rows.push_back({std::to_string(s.rank), s.host, a.label, a.state, std::to_string(a.mailbox_depth), running,
                      std::to_string(a.calls_served), std::to_string(a.restarts)});
    }
  }
  std::vector<std::size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows)
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  out << "troupe-run status: " << folder.string() << ", " << snapshots.size() << " rank(s)\n";
  for (const auto& row : rows) print_row(out, row, widths);
  for (const auto& note : notes) out << "note: " << note << "\n";
  return 0;
}

}  // namespace troupe::supervisor
