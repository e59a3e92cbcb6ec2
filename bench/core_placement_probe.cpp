// Which cache placement the hypervisor gives this VM's first two CPUs, right now, and
// what it does to the shared-memory collectives' slot copies (collectives/src/slot_writer.hpp):
// a cache-line round trip between a thread on CPU 0 and one on CPU 1, then a producer on
// CPU 0 copying 256 KB pieces into a ring of 4 slots that a consumer on CPU 1 copies out,
// once with plain stores and once with streaming ones, timing each side's copies.
//
//   bench/core_placement_probe [samples]     (default 10, one a second)
//
// A diagnostic, not part of bench/run: it shows the two placements behind the 2026-11-25
// figures in docs/COLLECTIVES.md (round trip ~110 ns vs ~530 ns; plain producer copies
// 10-20 GB/s vs 2-5 GB/s).
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "slot_writer.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double round_trip_ns() {
  constexpr long kTrips = 100000;
  alignas(64) std::atomic<long> ping{0};
  alignas(64) std::atomic<long> pong{0};
  std::thread other([&] {
    pin(1);
    for (long i = 1; i <= kTrips; ++i) {
      while (ping.load(std::memory_order_acquire) != i) {
      }
      pong.store(i, std::memory_order_release);
    }
  });
  const auto t0 = Clock::now();
  for (long i = 1; i <= kTrips; ++i) {
    ping.store(i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) {
    }
  }
  const double ns = seconds_since(t0) / kTrips * 1e9;
  other.join();
  return ns;
}

struct Handoff {
  double producer_gbs, consumer_gbs;
};

// 64 MB through 4 slots of 256 KB, as ShmCollective's rounds move it.
Handoff slot_handoff(bool streaming) {
  constexpr std::size_t kSlot = 256 << 10, kSlots = 4, kSource = 8 << 20;
  constexpr long kRounds = (64 << 20) / kSlot;
  static std::vector<std::byte> slots(kSlot * kSlots), source(kSource, std::byte{1}), sink(kSource);
  std::atomic<long> posted{0}, consumed{0};
  double producer = 0, consumer = 0;
  std::thread reader([&] {
    pin(1);
    for (long r = 0; r < kRounds; ++r) {
      while (posted.load(std::memory_order_acquire) <= r) {
      }
      const auto t = Clock::now();
      std::memcpy(sink.data() + (r * kSlot) % kSource, slots.data() + (r % kSlots) * kSlot, kSlot);
      consumer += seconds_since(t);
      consumed.store(r + 1, std::memory_order_release);
    }
  });
  for (long r = 0; r < kRounds; ++r) {
    while (r >= static_cast<long>(kSlots) &&
           consumed.load(std::memory_order_acquire) < r - static_cast<long>(kSlots) + 1) {
    }
    std::byte* slot = slots.data() + (r % kSlots) * kSlot;
    const std::byte* piece = source.data() + (r * kSlot) % kSource;
    const auto t = Clock::now();
    if (streaming)
      troupe::collectives::detail::copy_streaming(slot, piece, kSlot);
    else
      std::memcpy(slot, piece, kSlot);
    producer += seconds_since(t);
    posted.store(r + 1, std::memory_order_release);
  }
  reader.join();
  const double bytes = static_cast<double>(kSlot) * kRounds;
  return {bytes / producer / 1e9, bytes / consumer / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  const int samples = argc > 1 ? std::atoi(argv[1]) : 10;
  if (std::thread::hardware_concurrency() < 2) {
    std::fprintf(stderr, "core_placement_probe: needs two CPUs\n");
    return 1;
  }
  pin(0);
  std::printf("%-14s %28s %28s\n", "round trip", "plain: producer / consumer", "streaming: producer / consumer");
  for (int i = 0; i < samples; ++i) {
    const double rt = round_trip_ns();
    const Handoff plain = slot_handoff(false), streaming = slot_handoff(true);
    std::printf("%8.0f ns    %11.1f / %5.1f GB/s %15.1f / %5.1f GB/s\n", rt, plain.producer_gbs, plain.consumer_gbs,
                streaming.producer_gbs, streaming.consumer_gbs);
    std::fflush(stdout);
    if (i + 1 < samples) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}
