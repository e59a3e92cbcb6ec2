#include "metrics_server.hpp"
#include "listen.hpp"

#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <istream>
#include <memory>

#include "troupe/error.hpp"

namespace troupe::supervisor {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
std::string response(const std::string& status, const std::string& type, const std::string& body) {
  return "HTTP/1.1 " + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}
}  // namespace

// One connection: read the request head, answer, close.
class MetricsServer::Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<Shared> shared, tcp::socket socket)
      : shared_(std::move(shared)), socket_(std::move(socket)), timer_(socket_.get_executor()), head_(kMaxRequest) {
    ++shared_->open;
  }
  ~Exchange() { --shared_->open; }

  void start() {
    auto self = shared_from_this();
    timer_.expires_after(kRequestTimeout);
    timer_.async_wait([self](boost::system::error_code ec) {
      if (!ec) self->close();  // the request did not come in time
    });
    asio::async_read_until(socket_, head_, "\r\n\r\n", [self](boost::system::error_code ec, std::size_t) {
      if (ec) return self->close();  // closed, too long, or timed out
      self->answer();
    });
  }

 private:
  void answer() {
    std::istream in(&head_);
    std::string method, target, version;
    in >> method >> target >> version;
    if (!version.starts_with("HTTP/")) {
      reply_ = response("400 Bad Request", "text/plain", "not an HTTP request\n");
    } else if (method != "GET" && method != "HEAD") {
      reply_ = response("405 Method Not Allowed", "text/plain", "only GET\n");
    } else if (target == "/metrics" || target.starts_with("/metrics?")) {
      reply_ = response("200 OK", "text/plain; version=0.0.4; charset=utf-8", shared_->render());
      ++shared_->served;
    } else if (target == "/") {
      reply_ = response("200 OK", "text/plain", "troupe-run: metrics at /metrics\n");
    } else {
      reply_ = response("404 Not Found", "text/plain", "troupe-run serves /metrics\n");
    }
    if (method == "HEAD") reply_.resize(reply_.find("\r\n\r\n") + 4);
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(reply_), [self](boost::system::error_code, std::size_t) { self->close(); });
  }

  void close() {
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  std::shared_ptr<Shared> shared_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::streambuf head_;
  std::string reply_;
};

MetricsServer::MetricsServer(asio::io_context& io, const std::string& host, unsigned short port, Render render)
    : acceptor_(io), shared_(std::make_shared<Shared>(Shared{std::move(render)})) {
  listen_on(acceptor_, host, port, "--metrics");
  accept();
}

MetricsServer::~MetricsServer() {
  boost::system::error_code ignored;
  acceptor_.close(ignored);
}

std::string MetricsServer::url() const {
  const auto endpoint = acceptor_.local_endpoint();
  const std::string host =
      endpoint.address().is_v6() ? "[" + endpoint.address().to_string() + "]" : endpoint.address().to_string();
  return "http://" + host + ":" + std::to_string(endpoint.port()) + "/metrics";
}

unsigned short MetricsServer::port() const { return acceptor_.local_endpoint().port(); }

void MetricsServer::accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // closed: troupe-run is ending
    if (!ec) {
      if (shared_->open >= kMaxOpen) {
        boost::system::error_code ignored;
        socket.close(ignored);  // a scraper retries; a flood does not grow us
      } else {
        std::make_shared<Exchange>(shared_, std::move(socket))->start();
      }
    }
    accept();
  });
}

}  // namespace troupe::supervisor
