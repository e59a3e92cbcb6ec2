// MetricsServer: troupe-run's HTTP endpoint for Prometheus (--metrics HOST:PORT, off
// by default). `GET /metrics` answers the text exposition format (version 0.0.4),
// rendered at the moment of the request; `GET /` a line pointing there; anything else
// 404, a request that is not HTTP 400. Each connection is answered once and closed.
//
// Bounded like the heartbeat server, since anyone who can reach the port may connect:
// at most kMaxOpen connections at once (a further one is closed at once), a request
// head of at most kMaxRequest bytes, and kRequestTimeout to send it. It runs on
// troupe-run's io_context thread, so rendering reads the supervisor's state unlocked.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace troupe::supervisor {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  static constexpr int kMaxOpen = 16;
  static constexpr std::size_t kMaxRequest = 8192;
  static constexpr std::chrono::seconds kRequestTimeout{5};

  // Listens on host:port (port 0: any free one). Throws troupe::Error when it cannot bind.
  MetricsServer(boost::asio::io_context& io, const std::string& host, unsigned short port, Render render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "http://host:port/metrics", as a scraper's target names it.
  std::string url() const;
  unsigned short port() const;
  std::uint64_t requests_served() const { return shared_->served; }

 private:
  class Exchange;
  // What connections share with the server; they may outlive it in the io_context.
  struct Shared {
    Render render;
    int open = 0;
    std::uint64_t served = 0;
  };
  void accept();

  boost::asio::ip::tcp::acceptor acceptor_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace troupe::supervisor
