#include "slot_writer.hpp"

#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace troupe::collectives::detail {

void copy_streaming(std::byte* dst, const std::byte* src, std::size_t bytes) {
  if (bytes == 0) return;  // an empty tensor's pointer may be null, which memcpy may not take
  // Streaming stores need 16-byte aligned destinations: plain copies for the ends.
  const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  dst += head, src += head, bytes -= head;
  const std::size_t body = bytes & ~std::size_t{63};
  for (std::size_t i = 0; i < body; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i x0 = _mm_loadu_si128(s), x1 = _mm_loadu_si128(s + 1);
    const __m128i x2 = _mm_loadu_si128(s + 2), x3 = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, x0);
    _mm_stream_si128(d + 1, x1);
    _mm_stream_si128(d + 2, x2);
    _mm_stream_si128(d + 3, x3);
  }
  std::memcpy(dst + body, src + body, bytes - body);
  _mm_sfence();
}

void SlotWriter::copy(std::byte* slot, const std::byte* data, std::size_t bytes) {
  if (bytes < kTimedBytes) {
    std::memcpy(slot, data, bytes);
    return;
  }
  // Explore: the kind not in use, once in a while (and each kind until measured).
  bool stream = streaming_;
  if (rate_[!streaming_] == 0 || ++copies_ % kExploreEvery == 0) stream = !streaming_;
  const auto t0 = std::chrono::steady_clock::now();
  if (stream)
    copy_streaming(slot, data, bytes);
  else
    std::memcpy(slot, data, bytes);
  const auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  // The estimate is the best recent rate, decaying: a copy can only be made slower
  // by what is not its own doing (a context switch, a page fault, the compute thread
  // of DDP beside it on the core), never faster, so the fastest copies tell the truth.
  const double rate = static_cast<double>(bytes) / std::max(ns, 1.0);
  double& estimate = rate_[stream];
  estimate = std::max(rate, estimate * kDecay);
  // Streaming must win by a wide margin: its copies end in memory, so the peers read
  // them from there instead of from cache, a cost the writer's clock does not see.
  streaming_ = rate_[1] > kStreamingMargin * rate_[0];
}

}  // namespace troupe::collectives::detail
