// Timeline spans from a communicator (Communicator::set_tracer) and the Chrome trace
// they become (troupe/chrome_trace.hpp): what StepTrace builds on.
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "test_world.hpp"
#include "troupe/chrome_trace.hpp"
#include "troupe/trace.hpp"

namespace troupe::collectives::testing {
namespace {

TraceSpan span_of(std::string name, std::string category, std::int64_t begin = 0, std::int64_t end = 0,
                  std::uint32_t thread = 0, std::string track = {}, std::string args = {}) {
  return TraceSpan{.name = std::move(name),
                   .category = std::move(category),
                   .begin_ns = begin,
                   .end_ns = end,
                   .thread = thread,
                   .track = std::move(track),
                   .args = std::move(args)};
}

TEST(Trace, CollectivesAreSpansWithTheirFiguresOnlyWhileRecording) {
  Communicator& comm = world();
  Tracer tracer;
  comm.set_tracer(&tracer, "world collectives");
  std::vector<float> before(8, 1.0f);
  comm.allreduce(Buffer(before));  // not recording: nothing kept
  tracer.start();
  std::vector<float> values(1000, 1.0f);
  std::vector<std::int64_t> small(3, 2);
  Work big = comm.allreduce_async(Buffer(values));
  Work other = comm.allreduce_async(Buffer(small), ReduceOp::max);
  big.wait();
  other.wait();
  comm.barrier();
  tracer.stop();
  comm.allreduce(Buffer(before));  // stopped: nothing kept
  comm.set_tracer(nullptr, "");
  const std::vector<TraceSpan> spans = tracer.take();
  std::vector<TraceSpan> collectives;
  for (const TraceSpan& s : spans)
    if (s.category == "collective") collectives.push_back(s);
  ASSERT_EQ(collectives.size(), 3u);
  EXPECT_EQ(collectives[0].name, "allreduce");
  EXPECT_EQ(collectives[0].track, "world collectives");
  EXPECT_NE(collectives[0].args.find("\"bytes\":4000"), std::string::npos) << collectives[0].args;
  EXPECT_NE(collectives[0].args.find("\"op\":\"sum\""), std::string::npos) << collectives[0].args;
  EXPECT_NE(collectives[1].args.find("\"bytes\":24,\"count\":3,\"dtype\":\"i64\",\"op\":\"max\""), std::string::npos)
      << collectives[1].args;
  EXPECT_EQ(collectives[2].name, "barrier");
  for (const TraceSpan& s : spans) EXPECT_LE(s.begin_ns, s.end_ns) << s.name;
  // Waits are on the thread that waited, never on the track.
  for (const TraceSpan& s : spans)
    if (s.category == "wait") {
      EXPECT_TRUE(s.track.empty());
      EXPECT_EQ(s.thread, Tracer::this_thread_id());
    }
}

TEST(Trace, ScopesNestOnTheirThreadAndCostNothingWhenOff) {
  Tracer tracer;
  { const TraceScope off(&tracer, "compute", "forward"); }
  { const TraceScope none(nullptr, "compute", "forward"); }
  EXPECT_TRUE(tracer.take().empty());
  tracer.start();
  tracer.name_this_thread("training");
  {
    const TraceScope outer(&tracer, "step", "step 1");
    TraceScope inner(&tracer, "compute", "backward");
    inner.set_args("\"micro_batch\":2");
  }
  std::thread([&] { const TraceScope other(&tracer, "actor", "Counter #1.add"); }).join();
  const auto spans = tracer.take();
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].name, "step 1");  // sorted by begin: the outer first
  EXPECT_EQ(spans[1].name, "backward");
  EXPECT_EQ(spans[1].args, "\"micro_batch\":2");
  EXPECT_LE(spans[0].begin_ns, spans[1].begin_ns);
  EXPECT_GE(spans[0].end_ns, spans[1].end_ns);
  EXPECT_NE(spans[2].thread, spans[0].thread);
  ASSERT_EQ(tracer.thread_names().size(), 1u);
  EXPECT_EQ(tracer.thread_names()[0].second, "training");
}

TEST(Trace, ABoundedRecordingCountsWhatItDrops) {
  Tracer tracer(2);
  tracer.start();
  for (int i = 0; i < 5; ++i) tracer.record(span_of("s", "compute"));
  EXPECT_EQ(tracer.take().size(), 2u);
  EXPECT_EQ(tracer.dropped(), 3u);
}

TEST(ChromeTrace, OverlappingCollectivesGetRowsOfTheirOwnAndNamesAreEscaped) {
  RankTrace rank;
  rank.rank = 1;
  rank.host = "node \"b\"";
  rank.clock_offset_ns = 500;
  rank.thread_names = {{7, "training"}};
  rank.spans = {
      span_of("step 3", "step", 1000, 9000, 7),
      span_of("allreduce", "collective", 2000, 5000, 0, "dp collectives", "\"bytes\":8"),
      span_of("allreduce", "collective", 3000, 6000, 0, "dp collectives"),
      span_of("allreduce", "collective", 5500, 7000, 0, "dp collectives"),
  };
  const std::string events = chrome_trace_events(rank, 1500);
  // The step: 1000 + 500 - 1500 = 0 us; 8000 ns = 8 us.
  EXPECT_NE(
      events.find("{\"name\":\"step 3\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0.000,\"dur\":8.000,\"pid\":1,\"tid\":7}"),
      std::string::npos)
      << events;
  EXPECT_NE(events.find("\"args\":{\"name\":\"rank 1 (node \\\"b\\\")\"}"), std::string::npos) << events;
  EXPECT_NE(events.find("\"args\":{\"name\":\"training\"}"), std::string::npos);
  // The second all-reduce overlaps the first: a second row; the third fits the first row again.
  EXPECT_NE(events.find("\"args\":{\"name\":\"dp collectives\"}"), std::string::npos);
  EXPECT_NE(events.find("\"args\":{\"name\":\"dp collectives (2)\"}"), std::string::npos);
  EXPECT_EQ(events.find("dp collectives (3)"), std::string::npos);
  EXPECT_NE(events.find("\"ts\":4.500,\"dur\":1.500,\"pid\":1,\"tid\":1073741824}"), std::string::npos) << events;
  const std::string document = chrome_trace_document({events, "", events}, "\"steps\":[3,3]");
  EXPECT_EQ(document.rfind("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"steps\":[3,3]},", 0), 0u);
  EXPECT_EQ(document.find(",\n,"), std::string::npos);  // an empty fragment leaves no hole
}

}  // namespace
}  // namespace troupe::collectives::testing

namespace troupe::collectives::testing {
namespace {

// A device clock that is the host's: marks are host times, so the mapping onto the
// host clock can be checked exactly (the CUDA one needs a GPU: step_trace.cpp).
class HostClock final : public DeviceClock {
 public:
  void* mark() override {
    ++live;
    return new std::int64_t(Tracer::now_ns());
  }
  std::int64_t between_ns(void* from, void* to) override {
    return *static_cast<std::int64_t*>(to) - *static_cast<std::int64_t*>(from);
  }
  void release(void* mark) override {
    --live;
    delete static_cast<std::int64_t*>(mark);
  }
  int live = 0;
};

TEST(Trace, ADeviceClockGivesEveryComputeSpanATwinOnTheGpuRow) {
  auto clock = std::make_shared<HostClock>();
  {
    Tracer tracer;
    tracer.set_device_clock(clock);
    tracer.start();
    {
      TraceScope forward(&tracer, "compute", "forward");
      forward.set_args("\"micro_batch\":1");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    { const TraceScope data(&tracer, "data", "data"); }  // not compute: no twin
    tracer.stop();
    { const TraceScope late(&tracer, "compute", "backward"); }  // not recording: nothing
    const auto spans = tracer.take();
    EXPECT_EQ(clock->live, 0) << "every mark is released once timed";
    ASSERT_EQ(spans.size(), 3u);
    const auto gpu = std::find_if(spans.begin(), spans.end(), [](const TraceSpan& s) { return s.category == "gpu"; });
    const auto host = std::find_if(spans.begin(), spans.end(),
                                   [](const TraceSpan& s) { return s.name == "forward" && s.category == "compute"; });
    ASSERT_NE(gpu, spans.end());
    ASSERT_NE(host, spans.end());
    EXPECT_EQ(gpu->name, "forward");
    EXPECT_EQ(gpu->track, "GPU");
    EXPECT_EQ(gpu->args, "\"micro_batch\":1");
    // The device's times on the host clock: within the host span, give or take the
    // origin's tie to the host clock (a few microseconds).
    EXPECT_GE(gpu->end_ns - gpu->begin_ns, 2'000'000);
    EXPECT_NEAR(static_cast<double>(gpu->begin_ns), static_cast<double>(host->begin_ns), 1e6);
  }
  EXPECT_EQ(clock->live, 0);
}

}  // namespace
}  // namespace troupe::collectives::testing
