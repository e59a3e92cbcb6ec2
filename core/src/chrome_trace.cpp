#include "troupe/chrome_trace.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>

#include "troupe/json_string.hpp"

namespace troupe {
namespace {

// Microseconds with three decimals, from nanoseconds: exact, unlike a double.
std::string micros(std::int64_t ns) {
  const bool negative = ns < 0;
  const std::uint64_t magnitude = negative ? -static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  char text[48];
  std::snprintf(text, sizeof text, "%s%" PRIu64 ".%03" PRIu64, negative ? "-" : "", magnitude / 1000, magnitude % 1000);
  return text;
}

void append_meta(std::string& out, const char* what, int pid, std::int64_t tid, const std::string& name,
                 long long sort_index) {
  if (!out.empty()) out += ",\n";
  out += "{\"name\":\"";
  out += what;
  out += "\",\"ph\":\"M\",\"pid\":" + std::to_string(pid);
  if (tid >= 0) out += ",\"tid\":" + std::to_string(tid);
  out += ",\"args\":{\"name\":" + json_string(name) + "}}";
  if (sort_index >= 0) {
    out += ",\n{\"name\":\"";
    out += tid >= 0 ? "thread_sort_index" : "process_sort_index";
    out += "\",\"ph\":\"M\",\"pid\":" + std::to_string(pid);
    if (tid >= 0) out += ",\"tid\":" + std::to_string(tid);
    out += ",\"args\":{\"sort_index\":" + std::to_string(sort_index) + "}}";
  }
}

}  // namespace

std::string chrome_trace_events(const RankTrace& rank, std::int64_t origin_ns) {
  std::string out;
  const std::string process = "rank " + std::to_string(rank.rank) + (rank.host.empty() ? "" : " (" + rank.host + ")");
  append_meta(out, "process_name", rank.rank, -1, process, rank.rank);

  // Named tracks get ids above any thread id (Linux's pid_max is at most 2^22), one per
  // row: a span goes on the track's first row whose last span has ended.
  constexpr std::int64_t kTrackBase = std::int64_t{1} << 30;
  struct Row {
    std::int64_t tid;
    std::int64_t end_ns;
  };
  std::map<std::string, std::vector<Row>> tracks;
  std::int64_t next_track = kTrackBase;
  std::vector<std::pair<std::int64_t, std::string>> rows;  // named rows, in the order they appear
  std::vector<std::int64_t> threads;                       // thread rows seen

  std::string events;
  for (const TraceSpan& span : rank.spans) {
    std::int64_t tid = span.thread;
    if (!span.track.empty()) {
      auto& track = tracks[span.track];
      auto row = std::find_if(track.begin(), track.end(), [&](const Row& r) { return r.end_ns <= span.begin_ns; });
      if (row == track.end()) {
        const std::string name =
            track.empty() ? span.track : span.track + " (" + std::to_string(track.size() + 1) + ")";
        track.push_back({next_track, span.end_ns});
        rows.emplace_back(next_track++, name);
        row = track.end() - 1;
      }
      row->end_ns = std::max(row->end_ns, span.end_ns);
      tid = row->tid;
    } else if (std::find(threads.begin(), threads.end(), tid) == threads.end()) {
      threads.push_back(tid);
    }
    const std::int64_t begin = span.begin_ns + rank.clock_offset_ns - origin_ns;
    events += ",\n{\"name\":" + json_string(span.name) + ",\"cat\":" + json_string(span.category) +
              ",\"ph\":\"X\",\"ts\":" + micros(begin) +
              ",\"dur\":" + micros(std::max<std::int64_t>(0, span.end_ns - span.begin_ns)) +
              ",\"pid\":" + std::to_string(rank.rank) + ",\"tid\":" + std::to_string(tid);
    if (!span.args.empty()) events += ",\"args\":{" + span.args + "}";
    events += "}";
  }
  // Thread rows first (the named ones in the order they were named), then the tracks.
  long long sort = 0;
  for (const auto& [thread, name] : rank.thread_names) {
    if (std::find(threads.begin(), threads.end(), static_cast<std::int64_t>(thread)) == threads.end()) continue;
    append_meta(out, "thread_name", rank.rank, thread, name, sort++);
  }
  for (std::int64_t thread : threads) {
    const bool named = std::any_of(rank.thread_names.begin(), rank.thread_names.end(),
                                   [&](const auto& n) { return static_cast<std::int64_t>(n.first) == thread; });
    if (!named) append_meta(out, "thread_name", rank.rank, thread, "thread " + std::to_string(thread), sort++);
  }
  for (const auto& [tid, name] : rows) append_meta(out, "thread_name", rank.rank, tid, name, sort++);
  return out + events;
}

std::string chrome_trace_document(const std::vector<std::string>& fragments, std::string_view other_data) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{";
  out += other_data;
  out += "},\n\"traceEvents\":[\n";
  bool first = true;
  for (const std::string& fragment : fragments) {
    if (fragment.empty()) continue;
    if (!first) out += ",\n";
    out += fragment;
    first = false;
  }
  out += "\n]}\n";
  return out;
}

}  // namespace troupe
