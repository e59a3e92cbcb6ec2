// Back-pressure (SpawnOptions::mailbox_capacity): a fast sender and a slow actor.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "actors_fixture.hpp"
#include "troupe/actors/errors.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {

// A consumer slower than any sender: a millisecond per message.
struct Sink {
  void take(std::string payload) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    bytes += payload.size();
    ++taken;
  }
  int count() const { return taken; }
  // Blocks the actor until the test opens the gate: a consumer that is, for certain,
  // not consuming.
  void hold() {
    g_holding = true;
    while (!g_open.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  int taken = 0;
  std::size_t bytes = 0;
  static inline std::atomic<bool> g_holding{false}, g_open{false};
  static constexpr auto troupe_methods = troupe::methods<&Sink::take, &Sink::count, &Sink::hold>;
};

long resident_bytes() {
  long pages = 0, resident = 0;
  std::ifstream("/proc/self/statm") >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

}  // namespace

// An actor held busy with 4 calls waiting (its capacity): the next tell is refused and
// counted, an ask fails at once naming the bound; once it drains, calls go through.
TEST(BackPressure, ACallToAFullMailboxIsRefusedAtOnce) {
  if (runtime().rank() == 0 && pool_threads() > 0) {  // without pool threads a call runs as it is posted
    SpawnOptions options;
    options.mailbox_capacity = 4;
    auto sink = runtime().spawn_with<Sink>(0, options);
    Sink::g_holding = false;
    Sink::g_open = false;
    sink.tell(&Sink::hold);
    while (!Sink::g_holding.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    for (int i = 0; i < 4; ++i) sink.tell(&Sink::take, std::string("waits"));
    const std::uint64_t refused = runtime().refused_tells();
    sink.tell(&Sink::take, std::string("refused"));
    EXPECT_EQ(runtime().refused_tells(), refused + 1);
    try {
      sink.ask(&Sink::count).get();
      ADD_FAILURE() << "an ask to a full mailbox was not refused";
    } catch (const RemoteError& e) {
      EXPECT_EQ(e.code(), actors::ErrorCode::overloaded) << e.what();
      EXPECT_NE(std::string(e.what()).find("mailbox is full (4 calls"), std::string::npos) << e.what();
    }
    Sink::g_open = true;
    for (int tries = 0; tries < 2000; ++tries) {  // the four waiting calls drain, then the ask is taken
      try {
        EXPECT_EQ(sink.ask(&Sink::count).get(), 4);
        break;
      } catch (const RemoteError&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }
  barrier();
}

// 3000 tells of 32 KB (96 MB) from rank 0 at an actor on the last rank that holds at
// most 8: the rest are refused as they arrive, so the host's memory stays flat, and
// every tell is either taken or counted as refused.
TEST(BackPressure, AFastSenderAndASlowActorHoldMemoryFlat) {
  constexpr int kTells = 3000;
  constexpr std::size_t kPayload = 32 * 1024;
  const bool host = runtime().rank() == last_rank();
  const std::uint64_t refused_before = runtime().refused_tells();
  std::atomic<bool> sampling{host};
  std::atomic<long> peak{0};
  [[maybe_unused]] const long before = resident_bytes();  // read only where RSS means something (below)
  std::thread sampler;
  if (host)
    sampler = std::thread([&] {
      while (sampling.load()) {
        peak = std::max(peak.load(), resident_bytes());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  if (runtime().rank() == 0) {
    SpawnOptions options;
    options.name = "backpressure-sink";
    options.mailbox_capacity = 8;
    auto sink = runtime().spawn_with<Sink>(last_rank(), options);
    for (int i = 0; i < kTells; ++i) sink.tell(&Sink::take, std::string(kPayload, 'x'));
  }
  barrier();  // the flood is sent
  if (host) {
    auto sink = runtime().lookup<Sink>("backpressure-sink");
    int taken = 0;
    std::uint64_t refused = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      try {
        taken = sink.ask(&Sink::count).get();
      } catch (const RemoteError&) {  // still full
      }
      refused = runtime().refused_tells() - refused_before;
      if (taken + static_cast<std::int64_t>(refused) >= kTells) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    sampling = false;
    sampler.join();
    // How many are refused depends on how fast they arrive; that none piles up does not.
    EXPECT_EQ(taken + static_cast<std::int64_t>(refused), kTells) << "taken " << taken << ", refused " << refused;
#if !defined(__SANITIZE_ADDRESS__)  // ASan's quarantine keeps freed blocks resident: RSS says nothing there
    EXPECT_LT(peak.load() - before, 48L << 20)
        << "resident memory grew by " << ((peak.load() - before) >> 20) << " MB while 96 MB were sent";
#endif
  }
  barrier();
}
