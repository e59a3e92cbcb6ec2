#include "troupe/train/status.hpp"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "troupe/error.hpp"

namespace troupe::train {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%ld:%02ld", s / 60, s % 60);
  return text;
}

std::string metrics_text(const Metrics& metrics) {
  std::string out;
  char value[64];
  for (const auto& [name, v] : metrics) {
    std::snprintf(value, sizeof value, " %s %.4g", name.c_str(), v);
    out += value;
  }
  return out;
}
// Open MPI hands each rank a pseudo-terminal for stdout even when mpirun's own output
// goes to a file, so under mpirun isatty() cannot tell: there TROUPE_PROGRESS=bar asks
// for the bar, and plain lines are the default. TROUPE_PROGRESS=plain forces lines.
bool stream_is_terminal(std::FILE* out) {
  const char* mode = std::getenv("TROUPE_PROGRESS");
  if (mode != nullptr && std::strcmp(mode, "bar") == 0) return true;
  if (mode != nullptr && std::strcmp(mode, "plain") == 0) return false;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) return false;
  return ::isatty(::fileno(out)) == 1;
}
}  // namespace

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return ec == std::errc() ? std::string(text, end) : "null";
}

Status::Status(bool primary, StatusOptions options)
    : primary_(primary), options_(std::move(options)), start_(Clock::now()), epoch_start_(start_), last_plain_(start_) {
  if (!primary_) return;
  TROUPE_CHECK(options_.out != nullptr, "Status: output stream is null");
  bar_ = options_.progress_bar == 1 || (options_.progress_bar == -1 && stream_is_terminal(options_.out));
  if (!options_.metrics_path.empty()) {
    metrics_ = std::fopen(options_.metrics_path.c_str(), "a");
    TROUPE_CHECK(metrics_ != nullptr, "Status: cannot open metrics file '", options_.metrics_path,
                 "' for appending: ", std::strerror(errno));
  }
}

Status::~Status() {
  if (bar_open_) std::fputc('\n', options_.out);
  if (metrics_ != nullptr) std::fclose(metrics_);
}

double Status::wall_seconds() const { return since(start_); }

void Status::summary(const std::vector<std::pair<std::string, std::string>>& fields) {
  if (!primary_) return;
  end_progress();
  std::fprintf(options_.out, "== start ==\n");
  for (const auto& [key, value] : fields) std::fprintf(options_.out, "%-10s %s\n", (key + ":").c_str(), value.c_str());
  std::fflush(options_.out);
}

void Status::begin_epoch(std::int64_t epoch, std::int64_t epochs, std::int64_t steps) {
  if (!primary_) return;
  epoch_ = epoch;
  epochs_ = epochs;
  steps_ = steps;
  epoch_start_ = last_plain_ = Clock::now();
}

void Status::progress(std::int64_t done, std::int64_t samples, const Metrics& metrics) {
  if (!primary_) return;
  const double elapsed = since(epoch_start_);
  const double rate = elapsed > 0 ? static_cast<double>(samples) / elapsed : 0;
  const double eta = done > 0 ? elapsed * static_cast<double>(steps_ - done) / static_cast<double>(done) : NAN;
  if (bar_) {
    // Redrawing costs a write per step; ten times a second is enough for the eye.
    if (done < steps_ && bar_open_ && since(last_plain_) < 0.1) return;
    last_plain_ = Clock::now();
    constexpr int kWidth = 24;
    const int filled = steps_ > 0 ? static_cast<int>(kWidth * done / steps_) : kWidth;
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(static_cast<std::size_t>(kWidth - filled - 1), ' ');
    // \r and a clear-to-end-of-line: redraw in place.
    std::fprintf(options_.out, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld %.0f samples/s ETA %s%s",
                 static_cast<long long>(epoch_), static_cast<long long>(epochs_), bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(steps_), rate, format_duration(eta).c_str(),
                 metrics_text(metrics).c_str());
    bar_open_ = true;
  } else {
    if (since(last_plain_) < options_.plain_interval_s) return;
    last_plain_ = Clock::now();
    std::fprintf(options_.out, "epoch %lld/%lld step %lld/%lld %.0f samples/s ETA %s%s\n",
                 static_cast<long long>(epoch_), static_cast<long long>(epochs_), static_cast<long long>(done),
                 static_cast<long long>(steps_), rate, format_duration(eta).c_str(), metrics_text(metrics).c_str());
  }
  std::fflush(options_.out);
}

void Status::end_progress() {
  if (!primary_ || !bar_open_) return;
  std::fprintf(options_.out, "\r\033[K");
  bar_open_ = false;
}

void Status::print(const std::string& line) {
  if (!primary_) return;
  end_progress();
  std::fprintf(options_.out, "%s\n", line.c_str());
  std::fflush(options_.out);
}

void Status::log(std::int64_t step, std::int64_t epoch, const Metrics& metrics, double samples_per_s) {
  if (!primary_ || metrics_ == nullptr) return;
  std::string line = "{\"step\": " + std::to_string(step) + ", \"epoch\": " + std::to_string(epoch);
  for (const auto& [name, value] : metrics) {
    TROUPE_CHECK(name.find_first_of("\"\\") == std::string::npos && name != "step" && name != "epoch" &&
                     name != "samples_per_s" && name != "wall_s",
                 "Status::log: metric name '", name, "' is reserved or needs escaping");
    line += ", \"" + name + "\": " + json_number(value);
  }
  if (samples_per_s >= 0) line += ", \"samples_per_s\": " + json_number(samples_per_s);
  line += ", \"wall_s\": " + json_number(wall_seconds()) + "}\n";
  TROUPE_CHECK(std::fputs(line.c_str(), metrics_) >= 0 && std::fflush(metrics_) == 0,
               "Status: writing the metrics file '", options_.metrics_path, "' failed: ", std::strerror(errno));
}

}  // namespace troupe::train
