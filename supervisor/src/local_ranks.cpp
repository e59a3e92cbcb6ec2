#include "troupe/supervisor/local_ranks.hpp"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <string>

namespace troupe::supervisor {

namespace {
std::string this_host() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}
}  // namespace

void LocalRanks::begin_launch(int np) {
  processes_.clear();
  processes_.resize(static_cast<std::size_t>(np));
}

void LocalRanks::watch(const RankStatus& rank, std::function<void()> exited) {
  static const std::string host = this_host();
  if (rank.host != host || rank.pid <= 1 || rank.rank < 0 || static_cast<std::size_t>(rank.rank) >= processes_.size())
    return;
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(rank.pid), 0));
  if (fd < 0) return;  // gone already, or no pidfds: a stop then waits for mpirun
  auto process = std::make_shared<Process>(io_);
  process->fd.assign(fd);
  processes_[static_cast<std::size_t>(rank.rank)] = process;
  process->fd.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                         [process, exited = std::move(exited)](boost::system::error_code ec) {
                           if (ec) return;
                           process->exited = true;
                           exited();
                         });
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
