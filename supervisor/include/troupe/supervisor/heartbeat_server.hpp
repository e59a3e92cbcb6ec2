// HeartbeatServer: troupe-run's TCP endpoint for the ranks (protocol.hpp), on an Asio
// io_context driven by one thread (troupe-run's), so its state needs no locks.
//
// Every connection must open with a Hello carrying the run's token, run id, the
// current launch's restart count and a rank inside the world; anything else (a wrong
// token, garbage, a length prefix above kMaxPayload, silence for kHelloTimeout, a
// second connection for a rank) is refused with a reason, reported to the Listener
// and closed. Nothing a peer sends can make the server allocate more than
// kMaxPayload bytes per connection or throw out of the io_context.
//
// Per launch (begin_launch) it keeps one RankStatus per rank: when it was last heard
// from and when its progress (step, collective) last changed; the supervisor reads
// them to find a rank whose heartbeats stopped or that makes no progress. A
// registered connection that closes without Goodbye is reported as lost at once.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/supervisor/protocol.hpp"

namespace troupe::supervisor {

using Clock = std::chrono::steady_clock;

// How long a new connection may take to send its Hello.
inline constexpr std::chrono::seconds kHelloTimeout{5};
// Connections allowed to wait for their Hello at once; more are refused on arrival,
// so a flood of silent connections cannot use up troupe-run's file descriptors.
inline constexpr std::size_t kMaxPendingConnections = 64;

struct RankStatus {
  int rank = 0;
  bool registered = false;  // said Hello in this launch
  bool connected = false;
  bool said_goodbye = false;
  std::string host;  // as the rank reported it, made printable
  std::uint32_t pid = 0;
  std::string peer;  // the connection's remote address
  Clock::time_point last_heard{};
  Clock::time_point last_progress{};  // when (step, collective, phase) last changed
  Heartbeat progress;
};

class HeartbeatServer {
 public:
  // Callbacks, always from the io_context's thread.
  class Listener {
   public:
    virtual ~Listener() = default;
    virtual void on_rank_up(const RankStatus& rank) = 0;
    // A registered rank of the current launch went away without Goodbye (or broke the protocol).
    virtual void on_rank_lost(const RankStatus& rank, const std::string& reason) = 0;
    // A connection was refused; `peer` is its address.
    virtual void on_refused(const std::string& peer, const std::string& reason) = 0;
    // A rank's progress changed.
    virtual void on_progress(const RankStatus& rank) = 0;
    // A registered rank sent a Notice (a failed checkpoint save).
    virtual void on_notice(const RankStatus& rank, const Notice& notice) {
      (void)rank;
      (void)notice;
    }
  };

  // Listens on host:port (port 0: any free one). Throws troupe::Error when it cannot bind.
  HeartbeatServer(boost::asio::io_context& io, const std::string& host, unsigned short port, std::string token,
                  std::string run_id, Listener& listener);
  ~HeartbeatServer();
  HeartbeatServer(const HeartbeatServer&) = delete;
  HeartbeatServer& operator=(const HeartbeatServer&) = delete;

  // "host:port" the ranks should use (TROUPE_SUPERVISOR).
  std::string address() const;
  unsigned short port() const;

  // A new launch: ranks must present `restart`; connections of earlier launches are
  // closed and no longer reported.
  void begin_launch(std::uint32_t restart, int world_size);
  const std::vector<RankStatus>& ranks() const { return ranks_; }
  // Sends Stop to every registered rank of this launch; each ends itself (client.hpp)
  // and its connection then closes, reported through on_rank_lost as usual.
  void stop_ranks();
  std::uint32_t launch() const { return restart_; }

 private:
  class Connection;
  void accept();
  std::optional<std::string> check_hello(const Hello& hello) const;

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::string token_;
  std::string run_id_;
  Listener& listener_;
  std::uint32_t restart_ = 0;
  std::vector<RankStatus> ranks_;
  std::vector<std::weak_ptr<Connection>> connections_;
};

// The registered, connected rank silent the longest, if it has been silent for more
// than `threshold`; null otherwise. A failure is blamed on it rather than on a rank
// that ended because of it.
const RankStatus* longest_silent(const std::vector<RankStatus>& ranks, Clock::time_point now,
                                 Clock::duration threshold);

// Every rank registered and has since closed its connection, said goodbye, or been
// silent for `silent_for`: a job being stopped has nothing left running that
// troupe-run could still reach, on this host or another.
bool every_rank_gone(const std::vector<RankStatus>& ranks, Clock::time_point now, Clock::duration silent_for);

// `s` with every byte outside printable ASCII written as \xNN: peers' strings go into
// logs and JSON, and a hostile peer must not be able to forge lines there.
std::string printable(std::string_view s, std::size_t max = 200);

}  // namespace troupe::supervisor
