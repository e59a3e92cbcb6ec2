// troupe-run's events log: one JSON object per line (JSONL), written as it happens, so
// the file tells what happened even when troupe-run itself is killed.
//
// A line is written whole or not at all: one write(2) with O_APPEND, and a write that
// fails part-way (a full disk) is cut back off the file. troupe-run goes on without the
// lost lines -- it says so on stderr once -- and the first line it writes again is an
// "events_lost" event with how many were lost, so a reader knows the log has a hole.
//
//   {"time": 1763900000.123456, "run_id": "...", "event": "failure", "cause": "rank_lost", ...}
//
// Events: start, launch, rank_up, refused (a few per peer; refusal_limiter.hpp),
// refused_summary (how many more, by kind), failure, stopped, restart, resume, finish.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/json_string.hpp"

namespace troupe::supervisor {

// A value already written as JSON.
struct Json {
  std::string text;
  Json(std::string_view s);  // NOLINT: a string becomes a JSON string
  Json(const char* s) : Json(std::string_view(s)) {}
  Json(const std::string& s) : Json(std::string_view(s)) {}
  Json(double v);
  Json(int v) : text(std::to_string(v)) {}
  Json(long v) : text(std::to_string(v)) {}
  Json(unsigned long v) : text(std::to_string(v)) {}
  Json(unsigned v) : text(std::to_string(v)) {}
  Json(bool v) : text(v ? "true" : "false") {}
  static Json raw(std::string json) {
    Json j(0);
    j.text = std::move(json);
    return j;
  }
};

using JsonFields = std::vector<std::pair<std::string, Json>>;

using troupe::json_string;
// {"k": v, ...}
std::string json_object(const JsonFields& fields);

class EventLog {
 public:
  // Appends to `path`; an empty path logs nothing. Throws troupe::Error when the file
  // cannot be opened.
  EventLog(const std::string& path, std::string run_id);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  void write(std::string_view event, const JsonFields& fields = {});
  const std::string& path() const { return path_; }
  // Lines not written since the last one that was (0 once the log writes again).
  int lost() const { return lost_; }

 private:
  std::string line(std::string_view event, const JsonFields& fields) const;
  // Appends `text` whole, or leaves the file as it was and returns the errno.
  int append(const std::string& text);

  std::string path_;
  std::string run_id_;
  int fd_ = -1;
  int lost_ = 0;
};

}  // namespace troupe::supervisor
