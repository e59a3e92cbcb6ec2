#include "local_ranks.hpp"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>

namespace troupe::supervisor {

namespace {

std::string this_host() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// The parent of `pid` from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold
// spaces and parentheses, so the fields are read after the last ')'); -1 when gone.
pid_t parent_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 1));
  std::string state;
  pid_t parent = -1;
  fields >> state >> parent;
  return fields ? parent : -1;
}

std::optional<boost::asio::ip::address> address_of(const sockaddr* sa) {
  if (!sa) return std::nullopt;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    boost::asio::ip::address_v4::bytes_type bytes;
    std::memcpy(bytes.data(), &in->sin_addr, bytes.size());
    return boost::asio::ip::address_v4(bytes);
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    boost::asio::ip::address_v6::bytes_type bytes;
    std::memcpy(bytes.data(), &in6->sin6_addr, bytes.size());
    return boost::asio::ip::address_v6(bytes);
  }
  return std::nullopt;
}

// Compared as bytes: a link-local IPv6 peer arrives with a scope id an interface's
// address need not carry.
bool same_address(const boost::asio::ip::address& a, const boost::asio::ip::address& b) {
  if (a.is_v4() && b.is_v4()) return a.to_v4() == b.to_v4();
  if (a.is_v6() && b.is_v6()) return a.to_v6().to_bytes() == b.to_v6().to_bytes();
  return false;
}

}  // namespace

bool descends_from(pid_t pid, pid_t ancestor) {
  if (pid <= 1 || ancestor <= 1 || pid == ancestor) return false;
  // A bound, so a chain read while processes come and go cannot loop.
  for (int depth = 0; depth < 64 && pid > 1; ++depth) {
    pid = parent_of(pid);
    if (pid == ancestor) return true;
  }
  return false;
}

bool is_local_address(const boost::asio::ip::address& address) {
  if (address.is_loopback()) return true;
  if (address.is_unspecified()) return false;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return false;
  bool found = false;
  for (ifaddrs* i = interfaces; i && !found; i = i->ifa_next)
    if (auto mine = address_of(i->ifa_addr)) found = same_address(*mine, address);
  ::freeifaddrs(interfaces);
  return found;
}

void LocalRanks::begin_launch(int np, pid_t launcher) {
  launcher_ = launcher;
  processes_.clear();
  processes_.resize(static_cast<std::size_t>(np));
}

std::string LocalRanks::watch(const RankStatus& rank, std::function<void()> exited) {
  static const std::string host = this_host();
  if (rank.host != host || rank.rank < 0 || static_cast<std::size_t>(rank.rank) >= processes_.size()) return "";
  const pid_t pid = static_cast<pid_t>(rank.pid);
  if (!is_local_address(rank.peer_address))
    return "it names this host, but its connection comes from " + rank.peer_address.to_string() +
           ", not an address of this host";
  if (pid <= 1) return "its pid " + std::to_string(rank.pid) + " cannot be a rank's";
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return "pidfd_open(" + std::to_string(pid) + "): " + std::strerror(errno);
  // The pidfd first, the ancestry then, and the process found alive after: a pid freed
  // and reused during the check would have made the pidfd's process dead by now.
  std::string why;
  if (!descends_from(pid, launcher_))
    why = "pid " + std::to_string(pid) + " is not a descendant of this launch's mpirun (pid " +
          std::to_string(launcher_) + ")";
  else if (::syscall(SYS_pidfd_send_signal, fd, 0, nullptr, 0) != 0)
    why = "pid " + std::to_string(pid) + " exited while it was checked";
  if (!why.empty()) {
    ::close(fd);
    return why;
  }
  auto process = std::make_shared<Process>(io_);
  process->fd.assign(fd);
  processes_[static_cast<std::size_t>(rank.rank)] = process;
  process->fd.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                         [process, exited = std::move(exited)](boost::system::error_code ec) {
                           if (ec) return;
                           process->exited = true;
                           exited();
                         });
  return "";
}

void LocalRanks::signal(int signal) {
  for (auto& process : processes_)
    if (process && !process->exited) ::syscall(SYS_pidfd_send_signal, process->fd.native_handle(), signal, nullptr, 0);
}

bool LocalRanks::all_exited() const {
  return std::all_of(processes_.begin(), processes_.end(),
                     [](const auto& process) { return process && process->exited; });
}

}  // namespace troupe::supervisor
