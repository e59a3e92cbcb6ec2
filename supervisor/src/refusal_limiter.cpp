#include "refusal_limiter.hpp"

namespace troupe::supervisor {

std::string RefusalLimiter::Held::reasons() const {
  std::string out;
  for (const auto& [kind, n] : by_kind)
    out += (out.empty() ? "" : ", ") + std::string(refusal_name(kind)) + " " + std::to_string(n);
  return out;
}

std::string RefusalLimiter::Held::reasons_json() const {
  std::string out = "{";
  for (const auto& [kind, n] : by_kind)
    out += (out.size() > 1 ? ", \"" : "\"") + std::string(refusal_name(kind)) + "\": " + std::to_string(n);
  return out + "}";
}

RefusalLimiter::RefusalLimiter(Clock::duration period, std::size_t total, std::size_t per_peer)
    : period_(period), total_(total), per_peer_(per_peer) {}

bool RefusalLimiter::admit(Clock::time_point now, const Refusal& refusal) {
  if (!open_) {
    open_ = true;
    opened_ = now;
  }
  if (admitted_ < total_) {
    // Looked up only while there is room: a flood from ever new addresses (IPv6 gives
    // plenty) cannot grow the map past `total` entries.
    std::size_t& of_peer = admitted_of_[refusal.address];
    if (of_peer < per_peer_) {
      ++of_peer;
      ++admitted_;
      return true;
    }
  }
  ++held_.count;
  ++held_.by_kind[refusal.kind];
  return false;
}

std::optional<RefusalLimiter::Held> RefusalLimiter::end_window(Clock::time_point now, bool force) {
  if (!open_ || (!force && now < window_end())) return std::nullopt;
  Held held = std::move(held_);
  held.span = now - opened_;
  held_ = Held{};
  open_ = false;
  admitted_ = 0;
  admitted_of_.clear();
  if (held.count == 0) return std::nullopt;
  return held;
}

}  // namespace troupe::supervisor
