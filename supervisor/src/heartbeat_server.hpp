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
// Connections awaiting their Hello are bounded (kMaxPendingConnections in all,
// kMaxPendingPerPeer per peer address) by evicting the oldest pending one, never by
// refusing the newcomer: a real rank sends its Hello right after connecting, so it is
// always the newest, and silent connections cannot keep it out (the eviction policy
// is explained in heartbeat_server.cpp, at make_room()).
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
#include <string_view>
#include <vector>

#include "troupe/supervisor/protocol.hpp"

namespace troupe::supervisor {

using Clock = std::chrono::steady_clock;

// How long a new connection may take to send its Hello. A rank sends it in the same
// breath as connect(), so 2 s is a loaded host's worth of scheduling delay; a slot a
// silent peer holds is freed that much sooner when nothing else evicts it.
inline constexpr std::chrono::seconds kHelloTimeout{2};
// Connections allowed to wait for their Hello at once, so a flood of silent
// connections cannot use up troupe-run's file descriptors; past it the oldest pending
// connection is evicted.
inline constexpr std::size_t kMaxPendingConnections = 64;
// The same per peer address (all of a host's ranks share one: 127.0.0.1 under a local
// mpirun). A rank's connection is pending for two handler runs of the io_context (the
// accept, then the read of its Hello), so even a host of 128 ranks starting at once has
// a few pending at a time, and 8 leaves room; past it the peer's own oldest is evicted,
// so a host with many ranks is never locked out, while one flooding address can hold
// at most an eighth of kMaxPendingConnections and never evicts other hosts' ranks.
inline constexpr std::size_t kMaxPendingPerPeer = 8;

// Why a connection was refused, for counting refusals without parsing their text.
enum class RefusalKind {
  bad_hello,  // a well-formed Hello this run does not accept (token, run id, launch, rank)
  protocol,   // not the protocol: garbage, an oversized length prefix, not a Hello first
  silent,     // no complete Hello within kHelloTimeout, or closed before one
  evicted,    // pending when a newer connection needed its slot
};
std::string_view refusal_name(RefusalKind kind);

struct Refusal {
  std::string peer;     // "address:port"
  std::string address;  // the peer's IP address alone, what per-peer limits count by
  RefusalKind kind = RefusalKind::protocol;
  std::string reason;  // printable
};

struct RankStatus {
  int rank = 0;
  bool registered = false;  // said Hello in this launch
  bool connected = false;
  bool said_goodbye = false;
  std::string host;  // as the rank reported it, made printable
  std::uint32_t pid = 0;
  std::string peer;                       // the connection's remote address and port, printable
  boost::asio::ip::address peer_address;  // the same address, to tell a local rank (local_ranks.hpp)
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
    // A connection was refused or evicted. Called for every one, so a listener that
    // logs them bounds its own rate (troupe-run: refusal_limiter.hpp).
    virtual void on_refusal(const Refusal& refusal) { on_refused(refusal.peer, refusal.reason); }
    // The same for a listener that needs only the text; `peer` is "address:port".
    virtual void on_refused(const std::string& peer, const std::string& reason) {
      (void)peer;
      (void)reason;
    }
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
  // Sends Dump to every registered rank of this launch: each writes its dump file
  // (rank_dump.hpp) at its next heartbeat.
  void request_dumps();
  std::uint32_t launch() const { return restart_; }

 private:
  class Connection;
  void accept();
  void make_room(const boost::asio::ip::address& peer);
  std::optional<std::string> check_hello(const Hello& hello) const;

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::string token_;
  std::string run_id_;
  Listener& listener_;
  std::uint32_t restart_ = 0;
  std::vector<RankStatus> ranks_;
  std::vector<std::weak_ptr<Connection>> connections_;      // in order of arrival: the oldest first
  std::shared_ptr<void> alive_ = std::make_shared<char>();  // expires with the server (accept)
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
