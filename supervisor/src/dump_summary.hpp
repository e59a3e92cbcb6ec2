// Reads the ranks' dump files (troupe/supervisor/rank_dump.hpp) and says, one line per
// rank, where each one is: the collective it waits in and for how long, or, when it is
// in none, the last one it finished and the top of its main thread's stack. A hang
// shows as one rank in no collective (or an older one) while the others wait in the
// next: the rank that is behind is the one to look at.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "heartbeat_server.hpp"

namespace troupe::supervisor {

// Ranks 0..world_size-1 whose dump file is in `checkpoint_dir`'s dump folder; a rank
// without one is named as such.
std::vector<std::string> summarize_dumps(const std::string& checkpoint_dir, int world_size);

// True once every one of ranks 0..world_size-1 has a dump file.
bool all_dumped(const std::string& checkpoint_dir, int world_size);

// `troupe-run dump DIR`: finds the troupe-run running the job whose --checkpoint-dir is
// DIR (its start event in DIR/troupe-run-events.jsonl names its pid), sends it SIGUSR1
// and prints the summary of the dump it then logs. Returns 0, or 1 saying why not.
int request_dump(const std::string& dir, std::ostream& out, std::chrono::seconds wait = std::chrono::seconds(15));

// The crash dumps (rank_dump.hpp's crash_dump_path) written since `since`, one line
// each: "rank 1 crashed: SIGSEGV (address 0x0) in FaultInjector::fire < main; stacks and
// last collectives in DIR/troupe-run-dumps/crash-rank-1.txt".
std::vector<std::string> crash_dump_notes(const std::string& checkpoint_dir, std::filesystem::file_time_type since);

// Removes the dump files of an earlier request.
void clear_dumps(const std::string& checkpoint_dir);

// One request at a time for every rank's dump, on troupe-run's io_context: sends Dump
// to the launch's ranks, then checks every 50 ms until all have written theirs or
// kWait has passed, and calls `done` with the summary lines and the seconds it took.
class DumpCollector {
 public:
  using Done = std::function<void(const std::vector<std::string>& lines, double seconds)>;
  static constexpr auto kWait = std::chrono::seconds(3);
  DumpCollector(boost::asio::io_context& io, std::string checkpoint_dir)
      : timer_(io), dir_(std::move(checkpoint_dir)) {}
  bool busy() const { return busy_; }
  void collect(HeartbeatServer& server, Done done);
  void cancel() { timer_.cancel(); }

 private:
  void poll(const HeartbeatServer& server);
  boost::asio::steady_timer timer_;
  std::string dir_;
  bool busy_ = false;
  Clock::time_point asked_{};
  Done done_;
};

}  // namespace troupe::supervisor
