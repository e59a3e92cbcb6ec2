#include "dump_summary.hpp"

#include <signal.h>

#include <algorithm>
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "troupe/supervisor/rank_dump.hpp"

namespace troupe::supervisor {

namespace fs = std::filesystem;

namespace {

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t") - begin + 1);
}

// The function of a stack frame line, without its arguments: eu-stack's
// "#1  0x00007f1d2c0e1a1f ns::f(int) const" and gdb's "#1  0x... in ns::f (x=1) at f.cpp:3"
// both give "ns::f".
std::string frame_function(const std::string& line) {
  std::size_t at = line.find(' ');
  if (at == std::string::npos) return "";
  std::string rest = trim(line.substr(at));
  if (rest.starts_with("0x")) rest = trim(rest.substr(std::min(rest.find(' '), rest.size())));
  if (rest.starts_with("in ")) rest = rest.substr(3);
  const std::size_t end = rest.find_first_of(" (");
  return rest.substr(0, end);
}

std::string summarize_one(int rank, const std::string& path) {
  std::ifstream in(path);
  std::string header, line;
  std::getline(in, header);
  std::string waiting, last_done, pid;
  std::vector<std::string> main_frames;
  enum { none, collectives, threads } section = none;
  bool in_main = false;
  if (const auto at = header.find(", pid "); at != std::string::npos)
    pid = header.substr(at + 6, header.find(',', at + 6) - at - 6);
  while (std::getline(in, line)) {
    if (line.starts_with("== collectives")) {
      section = collectives;
      continue;
    }
    if (line.starts_with("== threads")) {
      section = threads;
      continue;
    }
    if (section == collectives) {
      if (line.find(": in flight for ") != std::string::npos && waiting.empty()) waiting = line;
      if (line.ends_with(", done")) last_done = line.substr(0, line.find(": started "));
    } else if (section == threads) {
      // eu-stack: "TID 1234:"; gdb: "Thread 1 (Thread 0x... (LWP 1234) ...":
      if (line.starts_with("TID ") || line.starts_with("Thread ")) {
        in_main = line.find("TID " + pid + ":") == 0 || line.find("(LWP " + pid + ")") != std::string::npos;
        continue;
      }
      if (in_main && line.starts_with("#") && main_frames.size() < 4) {
        const std::string f = frame_function(line);
        if (!f.empty()) main_frames.push_back(f);
      }
    }
  }
  std::string where = "rank " + std::to_string(rank);
  if (const auto at = header.find(", step "); at != std::string::npos) where += " (step " + header.substr(at + 7) + ")";
  if (!waiting.empty()) return where + ": waits in " + trim(waiting);
  where += ": in no collective";
  where += last_done.empty() ? "" : "; the last it finished: " + last_done;
  if (!main_frames.empty()) {
    where += "; its main thread is in ";
    for (std::size_t i = 0; i < main_frames.size(); ++i) where += (i ? " < " : "") + main_frames[i];
  }
  return where;
}

}  // namespace

std::vector<std::string> summarize_dumps(const std::string& checkpoint_dir, int world_size) {
  std::vector<std::string> lines;
  for (int r = 0; r < world_size; ++r) {
    const std::string path = dump_path(checkpoint_dir, r);
    lines.push_back(fs::exists(path) ? summarize_one(r, path)
                                     : "rank " + std::to_string(r) + ": no dump (its heartbeat thread did not answer)");
  }
  return lines;
}

bool all_dumped(const std::string& checkpoint_dir, int world_size) {
  for (int r = 0; r < world_size; ++r)
    if (!fs::exists(dump_path(checkpoint_dir, r))) return false;
  return true;
}

namespace {
// "rank 1 crashed: SIGSEGV (address 0x0) in f < g < h": the crashing thread's frames
// below the signal handler's (eu-stack's output; gdb's has no "TID" lines).
std::string summarize_crash(const std::string& rank, const std::string& path) {
  std::ifstream in(path);
  std::string header, crashed, line;
  std::getline(in, header);
  std::getline(in, crashed);
  if (!crashed.starts_with("crashed: ")) return "";
  std::string what = crashed.substr(9), thread;
  if (const auto at = what.find(" in thread "); at != std::string::npos) {
    thread = what.substr(at + 11);
    what.resize(at);
  }
  std::vector<std::string> frames;
  bool in_thread = false, past_handler = false;
  while (std::getline(in, line)) {
    if (line.starts_with("TID ")) {
      in_thread = !thread.empty() && line == "TID " + thread + ":";
      continue;
    }
    if (!in_thread || !line.starts_with("#")) continue;
    const std::string f = frame_function(line);
    if (f.find("on_crash_signal") != std::string::npos || f == "__restore_rt") {
      past_handler = true;
      frames.clear();
      continue;
    }
    if (past_handler && !f.empty() && f != "??" && frames.size() < 4) frames.push_back(f);
  }
  std::string note = "rank " + rank + " crashed: " + what;
  if (!frames.empty()) {
    note += " in ";
    for (std::size_t i = 0; i < frames.size(); ++i) note += (i ? " < " : "") + frames[i];
  }
  return note + "; stacks and last collectives in " + path;
}
}  // namespace

std::vector<std::string> crash_dump_notes(const std::string& checkpoint_dir, fs::file_time_type since) {
  std::vector<std::string> notes;
  std::error_code error;
  for (fs::directory_iterator it(dump_folder(checkpoint_dir), error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with("crash-rank-") || !name.ends_with(".txt")) continue;
    std::error_code time_error;
    if (fs::last_write_time(it->path(), time_error) < since || time_error) continue;
    const std::string note = summarize_crash(name.substr(11, name.size() - 15), it->path().string());
    if (!note.empty()) notes.push_back(note);
  }
  std::sort(notes.begin(), notes.end());
  return notes;
}

void clear_dumps(const std::string& checkpoint_dir) {
  std::error_code error;
  for (fs::directory_iterator it(dump_folder(checkpoint_dir), error), end; !error && it != end; it.increment(error))
    if (it->path().filename().string().starts_with("rank-")) fs::remove(it->path(), error);
}

namespace {
// The events of `path`, each line parsed; lines that are not JSON are skipped.
std::vector<boost::property_tree::ptree> read_events(const std::string& path) {
  std::vector<boost::property_tree::ptree> events;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    try {
      std::istringstream text(line);
      boost::property_tree::ptree event;
      boost::property_tree::read_json(text, event);
      events.push_back(std::move(event));
    } catch (const std::exception&) {  // a line being written, or damaged
    }
  }
  return events;
}
}  // namespace

int request_dump(const std::string& dir, std::ostream& out, std::chrono::seconds wait) {
  const std::string path = dir + "/troupe-run-events.jsonl";
  std::string run_id;
  int pid = 0;
  std::size_t dumps_before = 0;
  for (const auto& e : read_events(path)) {
    if (e.get<std::string>("event", "") == "start") {
      run_id = e.get<std::string>("run_id", "");
      pid = e.get<int>("pid", 0);
      dumps_before = 0;
    } else if (e.get<std::string>("event", "") == "dump") {
      ++dumps_before;
    }
  }
  if (pid <= 0) {
    out << "troupe-run dump: no troupe-run start event with a pid in " << path << "\n";
    return 1;
  }
  std::string command;
  std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/cmdline"), command, '\0');
  if (::kill(pid, 0) != 0 || command.find("troupe-run") == std::string::npos) {
    out << "troupe-run dump: run " << run_id << " (troupe-run pid " << pid << ") is not running on this host\n";
    return 1;
  }
  ::kill(pid, SIGUSR1);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    std::size_t seen = 0;
    for (const auto& e : read_events(path)) {
      if (e.get<std::string>("event", "") == "start") seen = 0;
      if (e.get<std::string>("event", "") != "dump" || ++seen <= dumps_before) continue;
      out << "troupe-run dump: run " << run_id << "; files in " << e.get<std::string>("folder", "?") << "\n";
      if (const auto ranks = e.get_child_optional("ranks"))
        for (const auto& [key, line] : *ranks) out << "  " << line.get_value<std::string>() << "\n";
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  out << "troupe-run dump: run " << run_id << " logged no dump within " << wait.count()
      << " s (it dumps only while the job runs)\n";
  return 1;
}

void DumpCollector::collect(HeartbeatServer& server, Done done) {
  busy_ = true;
  done_ = std::move(done);
  clear_dumps(dir_);
  server.request_dumps();
  asked_ = Clock::now();
  poll(server);
}

void DumpCollector::poll(const HeartbeatServer& server) {
  const int ranks = static_cast<int>(server.ranks().size());
  if (!all_dumped(dir_, ranks) && Clock::now() - asked_ < kWait) {
    timer_.expires_after(std::chrono::milliseconds(50));
    timer_.async_wait([this, &server](boost::system::error_code ec) {
      if (!ec) poll(server);
    });
    return;
  }
  busy_ = false;
  Done done = std::move(done_);
  done(summarize_dumps(dir_, ranks), std::chrono::duration<double>(Clock::now() - asked_).count());
}

}  // namespace troupe::supervisor
