#include "heartbeat_server.hpp"
#include "listen.hpp"

#include <unistd.h>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <cstdio>

#include "troupe/error.hpp"

namespace troupe::supervisor {

namespace asio = boost::asio;
using asio::ip::tcp;

std::string printable(std::string_view s, std::size_t max) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && out.size() < max; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\x%02x", c);
      out += buffer;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

const RankStatus* longest_silent(const std::vector<RankStatus>& ranks, Clock::time_point now,
                                 Clock::duration threshold) {
  const RankStatus* silent = nullptr;
  for (const auto& rank : ranks)
    if (rank.registered && rank.connected && !rank.said_goodbye && now - rank.last_heard > threshold &&
        (!silent || rank.last_heard < silent->last_heard))
      silent = &rank;
  return silent;
}

bool every_rank_gone(const std::vector<RankStatus>& ranks, Clock::time_point now, Clock::duration silent_for) {
  return std::all_of(ranks.begin(), ranks.end(), [&](const RankStatus& rank) {
    return rank.registered && (!rank.connected || rank.said_goodbye || now - rank.last_heard > silent_for);
  });
}

std::string_view refusal_name(RefusalKind kind) {
  switch (kind) {
    case RefusalKind::bad_hello: return "bad_hello";
    case RefusalKind::protocol: return "protocol";
    case RefusalKind::silent: return "silent";
    case RefusalKind::evicted: return "evicted";
  }
  return "unknown";
}

namespace {

// An IPv4 peer of a dual-stack socket arrives as ::ffff:a.b.c.d; count it as a.b.c.d.
asio::ip::address canonical(const asio::ip::address& address) {
  if (address.is_v6() && address.to_v6().is_v4_mapped())
    return asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
  return address;
}

double seconds_since(Clock::time_point then) { return std::chrono::duration<double>(Clock::now() - then).count(); }

// Compares without an early exit, so the time taken says nothing about the token.
bool same_token(std::string_view a, std::string_view b) {
  if (a.size() != b.size() || b.empty()) return false;  // the length is no secret
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

// One peer. Lives as long as an operation of its own is pending (shared_from_this),
// reads one frame at a time into a buffer of at most kMaxPayload bytes.
class HeartbeatServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HeartbeatServer& server, tcp::socket socket)
      : server_(&server), socket_(std::move(socket)), hello_timer_(socket_.get_executor()), accepted_(Clock::now()) {
    boost::system::error_code ec;
    auto endpoint = socket_.remote_endpoint(ec);
    if (!ec) address_ = canonical(endpoint.address());
    peer_ = ec ? "unknown peer" : address_.to_string() + ":" + std::to_string(endpoint.port());
  }

  const asio::ip::address& address() const { return address_; }

  void start() {
    auto self = shared_from_this();
    hello_timer_.expires_after(kHelloTimeout);
    hello_timer_.async_wait([self](boost::system::error_code ec) {
      if (!ec && self->rank_ < 0 && !self->closed_)
        self->refuse(RefusalKind::silent, "no hello within " + std::to_string(kHelloTimeout.count()) + " s");
    });
    read_header();
  }

  bool awaiting_hello() const { return rank_ < 0 && !closed_; }

  void send_stop() {
    if (rank_ >= 0 && !closed_) send(Stop{}, false);
  }

  void send_dump() {
    if (rank_ >= 0 && !closed_) send(Dump{}, false);
  }

  // Gives up this pending connection's slot to a newer one (make_room).
  void evict(const std::string& why) {
    char waited[32];
    std::snprintf(waited, sizeof waited, "%.3f", seconds_since(accepted_));
    refuse(RefusalKind::evicted, "evicted after " + std::string(waited) + " s without a hello: " + why);
  }

  // The server forgets this connection (a new launch, or shutdown): no more callbacks.
  void detach() {
    server_ = nullptr;
    close();
  }

 private:
  void read_header() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(header_), [self](boost::system::error_code ec, std::size_t) {
      if (self->closed_) return;
      if (ec)
        return self->lost(ec == asio::error::eof ? "connection closed without goodbye"
                                                 : "connection failed: " + ec.message());
      std::uint32_t length = 0;
      try {
        length = decode_length(self->header_.data());
      } catch (const FormatError& e) {
        return self->protocol_error(e.what());
      }
      self->payload_.resize(length);
      self->read_payload();
    });
  }

  void read_payload() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(payload_), [self](boost::system::error_code ec, std::size_t) {
      if (self->closed_) return;
      if (ec) return self->lost("connection closed in the middle of a message: " + ec.message());
      Message message;
      try {
        message = decode_payload(self->payload_.data(), self->payload_.size());
      } catch (const FormatError& e) {
        return self->protocol_error(e.what());
      }
      self->handle(message);
    });
  }

  void handle(const Message& message) {
    if (!server_) return close();
    if (rank_ < 0) {
      const auto* hello = std::get_if<Hello>(&message);
      if (!hello)
        return refuse(RefusalKind::protocol,
                      std::string("first message was ") + std::string(kind_name(message)) + ", not hello");
      if (auto why = server_->check_hello(*hello)) return refuse(RefusalKind::bad_hello, *why);
      hello_timer_.cancel();
      rank_ = static_cast<int>(hello->rank);
      RankStatus& status = server_->ranks_[static_cast<std::size_t>(rank_)];
      status.registered = status.connected = true;
      status.host = printable(hello->host, 64);
      status.pid = hello->pid;
      status.peer = peer_;
      status.peer_address = address_;
      status.last_heard = status.last_progress = Clock::now();
      send(Welcome{}, false);
      server_->listener_.on_rank_up(status);
      return read_header();
    }
    RankStatus& status = server_->ranks_[static_cast<std::size_t>(rank_)];
    status.last_heard = Clock::now();
    if (const auto* beat = std::get_if<Heartbeat>(&message)) {
      const Heartbeat& old = status.progress;
      bool changed = beat->has_step != old.has_step || beat->step != old.step ||
                     beat->has_sequence != old.has_sequence || beat->sequence != old.sequence ||
                     beat->phase != old.phase;
      status.progress = *beat;
      if (changed) {
        status.last_progress = status.last_heard;
        server_->listener_.on_progress(status);
      }
      // The answer a rank fences itself without (client.hpp). At most one in flight: a
      // partitioned rank's answers must not queue up here while its socket stays open.
      if (!alive_in_flight_) send_alive();
    } else if (std::holds_alternative<Goodbye>(message)) {
      status.said_goodbye = true;
    } else if (const auto* notice = std::get_if<Notice>(&message)) {
      server_->listener_.on_notice(status, Notice{notice->kind, printable(notice->text, kMaxNoticeText)});
    } else {
      return protocol_error(std::string("unexpected ") + std::string(kind_name(message)) + " from a registered rank");
    }
    read_header();
  }

  void protocol_error(const std::string& what) {
    if (rank_ < 0) return refuse(RefusalKind::protocol, what);
    lost("protocol error: " + what);
  }

  // A registered rank went away: report it unless it said goodbye.
  void lost(const std::string& reason) {
    if (server_ && rank_ >= 0) {
      RankStatus& status = server_->ranks_[static_cast<std::size_t>(rank_)];
      status.connected = false;
      if (!status.said_goodbye) server_->listener_.on_rank_lost(status, reason);
    } else if (server_) {
      report_refusal(RefusalKind::silent, "closed before a complete hello (" + reason + ")");
    }
    close();
  }

  void refuse(RefusalKind kind, const std::string& reason) {
    report_refusal(kind, reason);
    send(Refused{printable(reason)}, true);
  }

  void report_refusal(RefusalKind kind, const std::string& reason) {
    if (server_) server_->listener_.on_refusal(Refusal{peer_, address_.to_string(), kind, printable(reason)});
  }

  void send(const Message& message, bool then_close) {
    auto frame = std::make_shared<std::vector<std::uint8_t>>(encode(message));
    auto self = shared_from_this();
    if (then_close) closed_ = true;  // read handlers stop; the write still completes
    asio::async_write(socket_, asio::buffer(*frame), [self, frame, then_close](boost::system::error_code, std::size_t) {
      if (then_close) self->close();
    });
  }

  void send_alive() {
    static const std::vector<std::uint8_t> frame = encode(Alive{});
    alive_in_flight_ = true;
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(frame),
                      [self](boost::system::error_code, std::size_t) { self->alive_in_flight_ = false; });
  }

  void close() {
    closed_ = true;
    hello_timer_.cancel();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  HeartbeatServer* server_;
  tcp::socket socket_;
  asio::steady_timer hello_timer_;
  Clock::time_point accepted_;
  asio::ip::address address_;  // the peer's, canonical (IPv4 as IPv4)
  std::string peer_;
  int rank_ = -1;  // registered rank, -1 before hello
  bool closed_ = false;
  bool alive_in_flight_ = false;
  std::array<std::uint8_t, kFrameHeader> header_{};
  std::vector<std::uint8_t> payload_;
};

HeartbeatServer::HeartbeatServer(asio::io_context& io, const std::string& host, unsigned short port, std::string token,
                                 std::string run_id, Listener& listener)
    : io_(io), acceptor_(io), token_(std::move(token)), run_id_(std::move(run_id)), listener_(listener) {
  listen_on(acceptor_, host, port, "--bind");
  accept();
}

HeartbeatServer::~HeartbeatServer() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  for (auto& weak : connections_)
    if (auto c = weak.lock()) c->detach();
}

std::string HeartbeatServer::address() const {
  auto endpoint = acceptor_.local_endpoint();
  auto host = endpoint.address().to_string();
  if (endpoint.address().is_unspecified()) {
    // Bound to every interface (--bind 0.0.0.0:P): ranks on other nodes cannot connect
    // to 0.0.0.0, so they get this host's name, which the cluster resolves.
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) == 0 && name[0])
      return std::string(name) + ":" + std::to_string(endpoint.port());
  }
  if (endpoint.address().is_v6()) host = "[" + host + "]";
  return host + ":" + std::to_string(endpoint.port());
}

unsigned short HeartbeatServer::port() const { return acceptor_.local_endpoint().port(); }

void HeartbeatServer::stop_ranks() {
  for (auto& weak : connections_)
    if (auto c = weak.lock()) c->send_stop();
}

void HeartbeatServer::request_dumps() {
  for (auto& weak : connections_)
    if (auto c = weak.lock()) c->send_dump();
}

void HeartbeatServer::begin_launch(std::uint32_t restart, int world_size) {
  for (auto& weak : connections_)
    if (auto c = weak.lock()) c->detach();
  connections_.clear();
  restart_ = restart;
  ranks_.assign(static_cast<std::size_t>(world_size), RankStatus{});
  for (int r = 0; r < world_size; ++r) ranks_[static_cast<std::size_t>(r)].rank = r;
}

std::optional<std::string> HeartbeatServer::check_hello(const Hello& hello) const {
  if (!same_token(hello.token, token_)) return "wrong token";
  if (hello.run_id != run_id_) return "run id '" + printable(hello.run_id, 64) + "' is not this run's";
  if (hello.restart != restart_)
    return "rank from launch " + std::to_string(hello.restart) + ", the current launch is " + std::to_string(restart_);
  if (hello.world_size != ranks_.size())
    return "world size " + std::to_string(hello.world_size) + ", the job has " + std::to_string(ranks_.size());
  if (hello.rank >= ranks_.size())
    return "rank " + std::to_string(hello.rank) + " outside a world of " + std::to_string(ranks_.size());
  if (ranks_[hello.rank].registered) return "rank " + std::to_string(hello.rank) + " is already registered";
  return std::nullopt;
}

void HeartbeatServer::accept() {
  // An accept that completed before the server was destroyed still runs its handler
  // (closing the acceptor cancels only pending ones): `alive` tells it `this` is gone.
  acceptor_.async_accept([this, alive = std::weak_ptr<void>(alive_)](boost::system::error_code ec, tcp::socket socket) {
    if (alive.expired() || ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      auto connection = std::make_shared<Connection>(*this, std::move(socket));
      make_room(connection->address());
      connections_.push_back(connection);
      connection->start();
    }
    accept();
  });
}

// Room for one more connection awaiting its Hello from `peer`: past a limit, the
// oldest pending connection (of that peer, or of all) is evicted -- never the new one.
//
// Why the oldest: a rank sends its Hello in the same breath as connect(), and the
// io_context reads it one or two handler runs after the accept (a speculative read, its
// completion queued behind at most the next accept), so a rank's connection is the
// newest while it is pending and leaves the pending set before many newer ones can
// arrive. A silent connection, whatever it does, only ever gets older. Refusing the
// newcomer instead, as before, let 64 rotating silent connections keep every rank out.
// Why per peer first: a flood from one address then evicts only its own connections;
// to push out another host's rank it needs kMaxPendingConnections / kMaxPendingPerPeer
// addresses, and even then evicts ranks only if that many connections arrive within
// the moment a rank's Hello takes to be read.
void HeartbeatServer::make_room(const asio::ip::address& peer) {
  // Drop expired entries so a stream of strays does not grow the list.
  std::erase_if(connections_, [](const auto& weak) { return weak.expired(); });
  std::shared_ptr<Connection> oldest, oldest_of_peer;
  std::size_t pending = 0, of_peer = 0;
  for (const auto& weak : connections_) {
    auto c = weak.lock();
    if (!c || !c->awaiting_hello()) continue;
    ++pending;
    if (!oldest) oldest = c;
    if (c->address() != peer) continue;
    ++of_peer;
    if (!oldest_of_peer) oldest_of_peer = c;
  }
  if (of_peer >= kMaxPendingPerPeer)
    oldest_of_peer->evict(std::to_string(of_peer) + " connections from " + peer.to_string() +
                          " awaited one, the most one address may hold (" + std::to_string(kMaxPendingPerPeer) + ")");
  else if (pending >= kMaxPendingConnections)
    oldest->evict(std::to_string(pending) + " connections awaited one, the most troupe-run holds (" +
                  std::to_string(kMaxPendingConnections) + ")");
}

}  // namespace troupe::supervisor
