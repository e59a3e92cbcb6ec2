// The ranks' spans (trace.hpp) as one Chrome trace-event JSON document, the format
// chrome://tracing and Perfetto (ui.perfetto.dev) open: one process per rank, one row
// per thread, and one per named track (a communicator's collectives). Collectives in
// flight at once on one track (a bucket's all-reduce launched while the previous one
// runs) would not nest as a row's spans must, so a track gets as many rows as it
// needs: "world collectives", "world collectives (2)", ...
//
// Built in two halves so that ranks need not share a file system: each rank turns its
// own spans into a fragment of events (times on rank 0's clock, from an origin the
// ranks agreed on), and one rank joins the fragments into the document.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "troupe/trace.hpp"

namespace troupe {

struct RankTrace {
  int rank = 0;
  std::string host;
  std::int64_t clock_offset_ns = 0;  // added to this rank's times to put them on rank 0's clock
  std::vector<TraceSpan> spans;
  std::vector<std::pair<std::uint32_t, std::string>> thread_names;
  std::uint64_t dropped = 0;
};

// Comma-separated events (no brackets): the process and row names, then every span as
// a complete ("X") event with microsecond times from `origin_ns` (rank 0's clock).
std::string chrome_trace_events(const RankTrace& rank, std::int64_t origin_ns);

// The whole document from the ranks' fragments; `other_data` is JSON object members
// (without braces) kept under "otherData": the window, the run, the clock alignment.
std::string chrome_trace_document(const std::vector<std::string>& fragments, std::string_view other_data);

}  // namespace troupe
