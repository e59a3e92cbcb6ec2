#include "job_hosts.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "troupe/error.hpp"

namespace troupe::supervisor {
namespace {

int parse_slots(const std::string& text, const std::string& where) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TROUPE_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size() && value > 0, where, ": slots '",
               text, "' is not a positive whole number");
  return value;
}

JobHosts from_hostfile(const std::string& path) {
  std::ifstream in(path);
  TROUPE_CHECK(in.good(), "--hostfile '", path, "': cannot read it: ", std::strerror(errno));
  JobHosts result{{}, "--hostfile " + path};
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    JobHost host;
    if (!(words >> host.name)) continue;
    std::string where = path + ":" + std::to_string(number);
    for (std::string word; words >> word;) {
      if (word.rfind("slots=", 0) == 0) host.slots = parse_slots(word.substr(6), where);
      // max_slots=, and the rest of Open MPI's keywords, do not concern troupe-run
    }
    result.hosts.push_back(host);
  }
  TROUPE_CHECK(!result.hosts.empty(), "--hostfile '", path, "' names no host");
  return result;
}

JobHosts from_host_list(const std::string& list) {
  JobHosts result{{}, "--host"};
  std::stringstream items(list);
  for (std::string item; std::getline(items, item, ',');) {
    TROUPE_CHECK(!item.empty(), "--host '", list, "': an empty host name");
    JobHost host;
    auto colon = item.find(':');
    host.name = item.substr(0, colon);
    if (colon != std::string::npos) host.slots = parse_slots(item.substr(colon + 1), "--host '" + list + "'");
    result.hosts.push_back(host);
  }
  return result;
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr) >> 24) == 127;
  if (address->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  return false;
}

bool is_loopback_literal(const std::string& host) {
  in6_addr v6{};
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list) {
  std::vector<std::string> names;
  std::size_t i = 0;
  while (i < list.size()) {
    // One item: a prefix, then optionally [ranges] and a suffix, up to a comma outside brackets.
    auto open = list.find_first_of("[,", i);
    if (open == std::string::npos || list[open] == ',') {
      auto end = open == std::string::npos ? list.size() : open;
      if (end > i) names.push_back(list.substr(i, end - i));
      i = end + 1;
      continue;
    }
    auto close = list.find(']', open);
    TROUPE_CHECK(close != std::string::npos, "host list '", list, "': '[' without ']'");
    std::string prefix = list.substr(i, open - i);
    auto next = list.find(',', close);
    std::string suffix = list.substr(close + 1, (next == std::string::npos ? list.size() : next) - close - 1);
    std::stringstream ranges(list.substr(open + 1, close - open - 1));
    for (std::string range; std::getline(ranges, range, ',');) {
      auto dash = range.find('-');
      std::string first = range.substr(0, dash), last = dash == std::string::npos ? first : range.substr(dash + 1);
      long from = 0, to = 0;
      auto a = std::from_chars(first.data(), first.data() + first.size(), from);
      auto b = std::from_chars(last.data(), last.data() + last.size(), to);
      TROUPE_CHECK(!first.empty() && !last.empty() && a.ec == std::errc() && b.ec == std::errc() &&
                       a.ptr == first.data() + first.size() && b.ptr == last.data() + last.size() && from <= to &&
                       to - from < 100000,
                   "host list '", list, "': bad range '", range, "'");
      for (long n = from; n <= to; ++n) {
        std::string digits = std::to_string(n);
        if (digits.size() < first.size()) digits.insert(0, first.size() - digits.size(), '0');  // node[01-03]
        names.push_back(prefix + digits + suffix);
      }
    }
    i = next == std::string::npos ? list.size() : next + 1;
  }
  return names;
}

JobHosts job_hosts(const RunOptions& options, const std::function<const char*(const char*)>& getenv) {
  const auto& args = options.mpirun_args;
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--hostfile" || a == "-hostfile" || a == "--machinefile" || a == "-machinefile")
      return from_hostfile(args[i + 1]);
    if (a == "--host" || a == "-host" || a == "-H") return from_host_list(args[i + 1]);
  }
  if (const char* nodes = getenv("SLURM_JOB_NODELIST"); nodes && *nodes) {
    JobHosts result{{}, "the Slurm allocation"};
    for (auto& name : expand_hostlist(nodes)) result.hosts.push_back({name, 0});
    return result;
  }
  return {};
}

bool is_this_host(const std::string& name) {
  if (name == "localhost") return true;
  char own[256] = {};
  if (::gethostname(own, sizeof own - 1) == 0 && name == own) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) return false;
  bool loopback = found && is_loopback(found->ai_addr);
  ::freeaddrinfo(found);
  return loopback;
}

std::string route_source_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;  // the heartbeat address handed to ranks; IPv4 clusters are the norm
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0)
    TROUPE_THROW(InvalidArgument, "host '", host, "' does not resolve: ", ::gai_strerror(rc));
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  std::string error;
  sockaddr_in own{};
  socklen_t length = sizeof own;
  if (fd < 0 || ::connect(fd, found->ai_addr, found->ai_addrlen) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&own), &length) != 0)
    error = std::strerror(errno);
  char text[INET_ADDRSTRLEN] = {};
  char target[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr, target, sizeof target);
  ::freeaddrinfo(found);
  if (fd >= 0) ::close(fd);
  if (!error.empty()) TROUPE_THROW(InvalidArgument, "no route from this host to '", host, "' (", target, "): ", error);
  ::inet_ntop(AF_INET, &own.sin_addr, text, sizeof text);
  return text;
}

void choose_heartbeat_address(RunOptions& options, const JobHosts& hosts) {
  std::vector<std::string> remote;
  for (const auto& host : hosts.hosts)
    if (!is_this_host(host.name) && std::find(remote.begin(), remote.end(), host.name) == remote.end())
      remote.push_back(host.name);
  std::string names;
  for (const auto& name : remote) names += (names.empty() ? "" : ", ") + name;
  if (options.bind_host.empty()) options.bind_host = remote.empty() ? "127.0.0.1" : "0.0.0.0";
  if (remote.empty()) return;
  if (is_loopback_literal(options.bind_host))
    TROUPE_THROW(InvalidArgument, "--bind ", options.bind_host, " is a loopback address, but ", hosts.source,
                 " puts ranks on ", names,
                 ", which cannot reach it; leave --bind out (troupe-run then listens on "
                 "every interface) or give an address those hosts reach");
  // Every remote host must resolve, and have a route, before a launch is tried.
  std::string route;
  for (const auto& name : remote) {
    try {
      auto source = route_source_address(name);
      if (route.empty()) route = source;
    } catch (const InvalidArgument& e) {
      TROUPE_THROW(InvalidArgument, hosts.source, ": ", e.what());
    }
  }
  bool wildcard = options.bind_host == "0.0.0.0" || options.bind_host == "::";
  if (options.advertise.empty() && wildcard) options.advertise = route;
}

}  // namespace troupe::supervisor
