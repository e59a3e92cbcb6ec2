// This process's resident memory, from Linux's /proc: what the memory tests and
// benchmarks measure a save or a training step with. reset_peak_rss() makes the peak
// (VmHWM) the current RSS, so VmHWM read afterwards minus VmRSS read then is the
// growth in between.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace troupe {

// A field of /proc/self/status ("VmHWM:", "VmRSS:") in bytes; -1 when absent.
inline std::int64_t proc_status_bytes(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, field.size(), field) == 0) return std::stoll(line.substr(field.size())) * 1024;
  return -1;
}

// Linux's clear_refs 5: the peak RSS becomes the current RSS.
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace troupe
