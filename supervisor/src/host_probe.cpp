#include "troupe/supervisor/host_probe.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <filesystem>

#include "troupe/error.hpp"
#include "troupe/supervisor/mpirun_command.hpp"

namespace troupe::supervisor {

namespace asio = boost::asio;

HostProbe::HostProbe(asio::io_context& io, RunOptions options, std::string mpirun, Say say)
    : io_(io), options_(std::move(options)), mpirun_(std::move(mpirun)), say_(std::move(say)), timer_(io),
      deadline_(io) {}

HostProbe::~HostProbe() { stop(); }

void HostProbe::start(Hosts hosts, Answered answered) {
  hosts_ = std::move(hosts);
  answered_ = std::move(answered);
  active_ = true;
  if (!job_) schedule();  // a probe in flight schedules the next one when it ends
}

void HostProbe::stop() {
  active_ = false;
  timer_.cancel();
  deadline_.cancel();
  job_.reset();  // kills its group and reaps it
}

void HostProbe::schedule() {
  timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.probe_interval));
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || !active_ || job_) return;
    const auto hosts = hosts_();
    if (hosts.empty()) return;
    probe(hosts[static_cast<std::size_t>(started_++) % hosts.size()]);
  });
}

void HostProbe::probe(const std::string& host) {
  Job::Environment env;
  if (::geteuid() == 0) env = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};
  try {
    job_ = std::make_unique<Job>(io_, probe_command(options_, mpirun_, host), env);
  } catch (const Error& e) {
    say_("cannot probe host " + host + ": " + e.what());
    return schedule();
  }
  deadline_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::max(Seconds(10), options_.probe_interval)));
  deadline_.async_wait([this](boost::system::error_code ec) {
    if (!ec && job_) job_->signal_group(SIGKILL);
  });
  job_->on_exit([this, host](int status) {
    deadline_.cancel();
    asio::post(io_, [this] { job_.reset(); });  // not from inside its own callback
    if (!active_) return;
    if (status != 0) return schedule();
    active_ = false;
    answered_(host);
  });
}

long long newest_checkpoint_step(const std::string& dir) {
  long long newest = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 9 || name.rfind("ckpt-", 0) != 0 || name.substr(name.size() - 3) != ".h5") continue;
    const std::string digits = name.substr(5, name.size() - 8);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    newest = std::max(newest, std::stoll(digits));
  }
  return newest;
}

}  // namespace troupe::supervisor
