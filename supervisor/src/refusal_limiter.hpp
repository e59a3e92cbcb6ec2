// RefusalLimiter: how many refused connections troupe-run writes out, so that a flood
// of them floods neither its stderr nor its events log (each line there is flushed, so
// an unbounded stream of them costs troupe-run's only thread a write per connection).
//
// Time is cut into windows of `period`, each opened by the first refusal after the last
// one closed. Within a window the first `per_peer` refusals of each peer address are
// let through, up to `total` in all; the rest are only counted, by kind, and
// end_window() hands the count over once the window is over, for one summary line.
// troupe-run keeps two (supervisor.cpp): 5 lines a second on stderr, and in the events
// log 5 "refused" events per address and 20 in all per 10 s.
//
// Only troupe-run's io_context thread uses it; no locks.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "heartbeat_server.hpp"

namespace troupe::supervisor {

class RefusalLimiter {
 public:
  // The refusals a window held back.
  struct Held {
    std::size_t count = 0;
    Clock::duration span{};  // from the window's first refusal to its end
    std::map<RefusalKind, std::size_t> by_kind;
    std::string reasons() const;       // "evicted 93, silent 2"
    std::string reasons_json() const;  // {"evicted": 93, "silent": 2}
  };

  RefusalLimiter(Clock::duration period, std::size_t total, std::size_t per_peer);

  // Whether `refusal` is to be written out in full; if not, it is counted. Call
  // end_window(now) first, so that a refusal after a window's end opens a new one.
  bool admit(Clock::time_point now, const Refusal& refusal);
  // Once the current window is over (or at once with `force`): closes it and returns
  // what it held back, when it held anything back.
  std::optional<Held> end_window(Clock::time_point now, bool force = false);
  // Refusals held back in the current window, and when it ends.
  std::size_t held() const { return held_.count; }
  Clock::time_point window_end() const { return opened_ + period_; }

 private:
  Clock::duration period_;
  std::size_t total_, per_peer_;
  bool open_ = false;
  Clock::time_point opened_{};
  std::size_t admitted_ = 0;
  // Per address, only for addresses admitted in this window: at most `total` entries.
  std::map<std::string, std::size_t> admitted_of_;
  Held held_;
};

}  // namespace troupe::supervisor
