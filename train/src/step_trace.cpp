#include "troupe/train/step_trace.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "troupe/chrome_trace.hpp"
#include "troupe/collectives/buffer.hpp"
#include "troupe/error.hpp"
#include "troupe/json_string.hpp"
#include "troupe/supervisor/run_environment.hpp"
#include "troupe/tensor/device.hpp"

namespace troupe::train {
namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

// What to add to this rank's steady clock to read rank 0's: the best of 8 round trips
// with rank 0 (Cristian's algorithm: the one with the shortest round trip bounds the
// error by half of it). Every rank runs it, rank 1 to n-1 in turn.
std::int64_t clock_offset(collectives::Communicator& comm) {
  constexpr int kRounds = 8;
  std::int64_t best_rtt = std::numeric_limits<std::int64_t>::max(), offset = 0;
  std::vector<std::int64_t> stamp(1);
  for (int peer = 1; peer < comm.size(); ++peer) {
    if (comm.rank() != 0 && comm.rank() != peer) continue;
    for (int i = 0; i < kRounds; ++i) {
      if (comm.rank() == 0) {
        comm.recv(collectives::Buffer(stamp), peer, 1);
        stamp[0] = Tracer::now_ns();
        comm.send(collectives::Buffer(stamp), peer, 2);
        continue;
      }
      const std::int64_t sent = Tracer::now_ns();
      stamp[0] = sent;
      comm.send(collectives::Buffer(stamp), 0, 1);
      comm.recv(collectives::Buffer(stamp), 0, 2);
      const std::int64_t received = Tracer::now_ns();
      if (received - sent < best_rtt) {
        best_rtt = received - sent;
        offset = stamp[0] - (sent + received) / 2;
      }
    }
  }
  return offset;
}

// The GPU's clock: CUDA events on the current device's stream.
class CudaClock final : public DeviceClock {
 public:
  void* mark() override { return tensor::cuda_event_record(); }
  std::int64_t between_ns(void* from, void* to) override {
    return std::llround(tensor::cuda_event_elapsed_ms(from, to) * 1e6);
  }
  void release(void* mark) override { tensor::cuda_event_destroy(mark); }
};

}  // namespace

void StepTrace::time_gpu() { tracer_->set_device_clock(std::make_shared<CudaClock>()); }

TraceWindow parse_trace_window(std::string_view text, std::string_view what) {
  const auto number = [&](std::string_view part) {
    std::int64_t value = 0;
    bool digits = !part.empty() && part.size() < 18;
    for (char c : part) {
      if (c < '0' || c > '9') digits = false;
      value = value * 10 + (c - '0');
    }
    if (!digits)
      TROUPE_THROW(InvalidArgument, what, ": '", std::string(text),
                   "' is not a window of steps (FIRST-LAST or STEP, e.g. 3-5)");
    return value;
  };
  const auto dash = text.find('-');
  TraceWindow window;
  window.first = number(text.substr(0, dash));
  window.last = dash == std::string_view::npos ? window.first : number(text.substr(dash + 1));
  TROUPE_CHECK(window.first >= 1 && window.first <= window.last, what, ": '", std::string(text),
               "' must name steps FIRST <= LAST, from 1");
  return window;
}

std::unique_ptr<StepTrace> make_step_trace(const std::string& dir, const std::string& steps) {
  const char* env_dir = std::getenv(supervisor::kEnvTraceDir);
  const char* env_steps = std::getenv(supervisor::kEnvTraceSteps);
  const bool from_options = !dir.empty();
  const std::string folder = from_options ? dir : env_dir != nullptr ? env_dir : "";
  if (folder.empty()) return nullptr;
  const std::string window = from_options ? steps : env_steps != nullptr ? env_steps : "";
  const TraceWindow parsed =
      window.empty() ? TraceWindow{}
                     : parse_trace_window(window, from_options ? "trace_steps" : supervisor::kEnvTraceSteps);
  return std::make_unique<StepTrace>(folder, parsed, program_invocation_short_name);
}

StepTrace::StepTrace(std::string dir, TraceWindow window, std::string program)
    : dir_(std::move(dir)),
      window_(window),
      program_(std::move(program)),
      tracer_(std::make_shared<Tracer>()),
      comm_(collectives::world_communicator()) {}

StepTrace::~StepTrace() = default;

void StepTrace::step_begins(std::int64_t step) {
  if (done_ || step < window_.first || step > window_.last) return;
  if (!tracer_->recording()) {
    tracer_->name_this_thread("training");
    first_recorded_ = step;
    tracer_->start();
  }
  step_begin_ns_ = Tracer::now_ns();
}

void StepTrace::step_ends(std::int64_t step) {
  if (!tracer_->recording()) return;
  tracer_->record(TraceSpan{.name = "step " + std::to_string(step),
                            .category = "step",
                            .begin_ns = step_begin_ns_,
                            .end_ns = Tracer::now_ns(),
                            .thread = Tracer::this_thread_id(),
                            .track = {},
                            .args = "\"step\":" + std::to_string(step)});
  last_recorded_ = step;
  if (step >= window_.last) write();
}

void StepTrace::call_ends() {
  if (tracer_->recording()) write();
}

void StepTrace::write() {
  tracer_->stop();
  RankTrace mine{.rank = comm_->rank(),
                 .host = host_name(),
                 .clock_offset_ns = clock_offset(*comm_),
                 .spans = tracer_->take(),
                 .thread_names = tracer_->thread_names(),
                 .dropped = tracer_->dropped()};
  std::vector<std::int64_t> origin{mine.spans.empty() ? std::numeric_limits<std::int64_t>::max()
                                                      : mine.spans.front().begin_ns + mine.clock_offset_ns};
  comm_->allreduce(collectives::Buffer(origin), collectives::ReduceOp::min);
  const std::string fragment = chrome_trace_events(mine, origin[0]);

  // Each rank's figures, then its fragment padded to the longest (gather takes equal parts).
  const int n = comm_->size();
  std::vector<std::int64_t> figures{static_cast<std::int64_t>(fragment.size()),
                                    static_cast<std::int64_t>(mine.spans.size()),
                                    static_cast<std::int64_t>(mine.dropped), mine.clock_offset_ns};
  std::vector<std::int64_t> all_figures(figures.size() * static_cast<std::size_t>(n));
  comm_->allgather(collectives::Buffer(figures), collectives::Buffer(all_figures));
  std::int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, all_figures[static_cast<std::size_t>(r) * 4]);
  std::vector<std::uint8_t> padded(static_cast<std::size_t>(longest));
  std::memcpy(padded.data(), fragment.data(), fragment.size());
  std::vector<std::uint8_t> gathered(comm_->rank() == 0 ? padded.size() * static_cast<std::size_t>(n) : 0);
  comm_->gather(collectives::Buffer(padded), collectives::Buffer(gathered), 0);
  done_ = true;
  if (comm_->rank() != 0) return;

  std::vector<std::string> fragments;
  std::int64_t spans = 0, dropped = 0;
  std::string offsets;
  for (int r = 0; r < n; ++r) {
    const auto* f = &all_figures[static_cast<std::size_t>(r) * 4];
    fragments.emplace_back(reinterpret_cast<const char*>(gathered.data()) + static_cast<std::size_t>(r) * padded.size(),
                           static_cast<std::size_t>(f[0]));
    spans += f[1];
    dropped += f[2];
    offsets += (r ? "," : "") + std::to_string(f[3]);
  }
  const std::string other = "\"program\":" + json_string(program_) + ",\"steps\":[" + std::to_string(first_recorded_) +
                            "," + std::to_string(last_recorded_) + "],\"ranks\":" + std::to_string(n) +
                            ",\"spans\":" + std::to_string(spans) + ",\"dropped\":" + std::to_string(dropped) +
                            ",\"clock_offsets_ns\":[" + offsets + "]";
  const std::filesystem::path file = std::filesystem::path(dir_) / "trace.json";
  try {
    std::filesystem::create_directories(dir_);
    const std::filesystem::path partial = file.string() + ".partial";
    {
      std::ofstream out(partial, std::ios::binary | std::ios::trunc);
      out << chrome_trace_document(fragments, other);
      out.close();
      if (!out) TROUPE_THROW(Error, "could not write ", partial.string(), ": ", std::strerror(errno));
    }
    std::filesystem::rename(partial, file);
    std::printf("trace of steps %lld-%lld: %s (%lld spans from %d ranks; open it in ui.perfetto.dev)\n",
                static_cast<long long>(first_recorded_), static_cast<long long>(last_recorded_), file.c_str(),
                static_cast<long long>(spans), n);
    std::fflush(stdout);
  } catch (const std::exception& e) {  // a trace is worth a warning, not the run
    std::fprintf(stderr, "troupe: the trace was not written: %s\n", e.what());
  }
}

}  // namespace troupe::train
