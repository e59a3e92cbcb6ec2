#include "event_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "troupe/error.hpp"

namespace troupe::supervisor {

Json::Json(std::string_view s) : text(json_string(s)) {}

Json::Json(double v) {
  if (!std::isfinite(v)) {
    text = "null";
    return;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6f", v);
  text = buffer;
}

std::string json_object(const JsonFields& fields) {
  std::string out = "{";
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ", ";
    out += json_string(fields[i].first) + ": " + fields[i].second.text;
  }
  return out + "}";
}

EventLog::EventLog(const std::string& path, std::string run_id) : path_(path), run_id_(std::move(run_id)) {
  if (path_.empty()) return;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    TROUPE_THROW(Error, "troupe-run: cannot open the events log '", path_, "' for appending: ", std::strerror(errno));
}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

std::string EventLog::line(std::string_view event, const JsonFields& fields) const {
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  JsonFields line = {{"time", Json(now)}, {"run_id", Json(run_id_)}, {"event", Json(event)}};
  line.insert(line.end(), fields.begin(), fields.end());
  return json_object(line) + '\n';
}

int EventLog::append(const std::string& text) {
  struct stat before {};
  if (::fstat(fd_, &before) != 0) return errno;
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      if (done > 0 && ::ftruncate(fd_, before.st_size) != 0) {
        // The partial line stays; a newline at least keeps the next line whole.
        [[maybe_unused]] const ssize_t ignored = ::write(fd_, "\n", 1);
      }
      return error;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

void EventLog::write(std::string_view event, const JsonFields& fields) {
  if (fd_ < 0) return;
  std::string text = line(event, fields);
  if (lost_ > 0) text = line("events_lost", {{"lines", lost_}}) + text;
  if (const int error = append(text); error != 0) {
    if (lost_++ == 0)
      std::fprintf(stderr, "troupe-run: cannot write the events log %s (%s); going on without it until it can\n",
                   path_.c_str(), std::strerror(error));
    return;
  }
  if (lost_ > 0)
    std::fprintf(stderr, "troupe-run: the events log %s is written again (%d line(s) lost)\n", path_.c_str(), lost_);
  lost_ = 0;
}

}  // namespace troupe::supervisor
