#include "troupe/supervisor/event_log.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "troupe/error.hpp"

namespace troupe::supervisor {

Json::Json(std::string_view s) : text(json_quote(s)) {}

Json::Json(double v) {
  if (!std::isfinite(v)) {
    text = "null";
    return;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6f", v);
  text = buffer;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(c));
          out += buffer;
        } else {
          out += c;  // UTF-8 passes through; other bytes from a hostile peer were hex-escaped by the caller
        }
    }
  }
  return out + "\"";
}

std::string json_object(const JsonFields& fields) {
  std::string out = "{";
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ", ";
    out += json_quote(fields[i].first) + ": " + fields[i].second.text;
  }
  return out + "}";
}

EventLog::EventLog(const std::string& path, std::string run_id) : path_(path), run_id_(std::move(run_id)) {
  if (path_.empty()) return;
  out_.open(path_, std::ios::app);
  if (!out_) TROUPE_THROW(Error, "troupe-run: cannot open the events log '", path_, "' for appending");
}

void EventLog::write(std::string_view event, const JsonFields& fields) {
  if (path_.empty()) return;
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  JsonFields line = {{"time", Json(now)}, {"run_id", Json(run_id_)}, {"event", Json(event)}};
  line.insert(line.end(), fields.begin(), fields.end());
  out_ << json_object(line) << '\n';
  out_.flush();
}

}  // namespace troupe::supervisor
