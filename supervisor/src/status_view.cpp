#include "status_view.hpp"

#include <algorithm>
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <vector>

namespace troupe::supervisor {

namespace fs = std::filesystem;

std::string status_dir(const std::string& checkpoint_dir) { return checkpoint_dir + "/troupe-run-status"; }

void clear_status(const std::string& checkpoint_dir) {
  std::error_code error;
  for (fs::directory_iterator it(status_dir(checkpoint_dir), error), end; !error && it != end; it.increment(error))
    if (it->path().filename().string().starts_with("rank-")) fs::remove(it->path(), error);
}

namespace {

struct Snapshot {
  int rank = -1;
  std::string host;
  long long time = 0;
  bool finished = false;
  boost::property_tree::ptree actors;
};

std::string fixed(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

void print_row(std::ostream& out, const std::vector<std::string>& cells, const std::vector<std::size_t>& widths) {
  for (std::size_t i = 0; i < cells.size(); ++i) {
    out << cells[i];
    if (i + 1 < cells.size()) out << std::string(widths[i] - cells[i].size() + 2, ' ');
  }
  out << "\n";
}

}  // namespace

int print_status(const std::string& dir, std::ostream& out, std::chrono::seconds stale) {
  fs::path folder = dir;
  if (fs::is_directory(status_dir(dir))) folder = status_dir(dir);
  std::vector<Snapshot> snapshots;
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("rank-") || !name.ends_with(".json")) continue;
    Snapshot s;
    try {
      boost::property_tree::ptree tree;
      boost::property_tree::read_json(it->path().string(), tree);
      s.rank = tree.get<int>("rank");
      s.host = tree.get<std::string>("host", "");
      s.time = tree.get<long long>("time", 0);
      s.finished = tree.get<bool>("finished", false);
      if (auto actors = tree.get_child_optional("actors")) s.actors = *actors;
    } catch (const std::exception& e) {  // a rank's file from another version, or damaged: say so, show the rest
      out << "troupe-run status: " << it->path().string() << " is not a status snapshot (" << e.what() << ")\n";
      continue;
    }
    snapshots.push_back(std::move(s));
  }
  if (snapshots.empty()) {
    out << "troupe-run status: no status in " << folder.string()
        << (error ? " (" + error.message() + ")" : std::string())
        << "; the job writes it there when run by troupe-run with --checkpoint-dir\n";
    return 1;
  }
  std::sort(snapshots.begin(), snapshots.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  const long long now = std::time(nullptr);
  std::vector<std::vector<std::string>> rows = {
      {"rank", "host", "actor", "state", "mailbox", "running", "served", "restarts"}};
  std::vector<std::string> notes;
  for (const Snapshot& s : snapshots) {
    const long long age = now - s.time;
    if (s.finished)
      notes.push_back("rank " + std::to_string(s.rank) + " has finished (its runtime shut down)");
    else if (age > stale.count())
      notes.push_back("rank " + std::to_string(s.rank) + "'s snapshot is " + std::to_string(age) +
                      " s old: the rank may be stuck or gone");
    for (const auto& [key, a] : s.actors) {
      std::string running = a.get<std::string>("running", "");
      if (!running.empty()) running += " for " + fixed(a.get<double>("running_for_s", 0), 1) + " s";
      rows.push_back({std::to_string(s.rank), s.host, a.get<std::string>("label", "?"),
                      a.get<std::string>("state", "?"), a.get<std::string>("mailbox_depth", "0"),
                      running.empty() ? "-" : running, a.get<std::string>("calls_served", "0"),
                      a.get<std::string>("restarts", "0")});
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
