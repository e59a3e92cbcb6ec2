#include "listen.hpp"

#include "troupe/error.hpp"

namespace troupe::supervisor {

void listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, unsigned short port,
               const std::string& flag) {
  using boost::asio::ip::tcp;
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  if (ec) TROUPE_THROW(InvalidArgument, flag, ": '", host, "' is not an IP address (", ec.message(), ")");
  const tcp::endpoint endpoint(address, port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(boost::asio::socket_base::max_listen_connections, ec);
  if (ec) TROUPE_THROW(Error, flag, ": cannot listen on ", host, ":", port, ": ", ec.message());
}

}  // namespace troupe::supervisor
