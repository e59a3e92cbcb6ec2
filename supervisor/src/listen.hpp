// The listening socket troupe-run's two servers share (heartbeat_server, metrics_server).
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <string>

namespace troupe::supervisor {

// Opens `acceptor` on host:port (an IP address; port 0 picks a free one), with
// SO_REUSEADDR so that a relaunched troupe-run gets its port back at once, and listens.
// A host that is not an IP address is an InvalidArgument, a port it cannot listen on an
// Error; both start with `flag` ("--metrics", "--bind"), the option that named them.
void listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, unsigned short port,
               const std::string& flag);

}  // namespace troupe::supervisor
