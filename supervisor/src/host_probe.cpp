#include "host_probe.hpp"

#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <filesystem>

#include "mpirun_command.hpp"
#include "troupe/error.hpp"

namespace troupe::supervisor {

namespace asio = boost::asio;

HostProbe::HostProbe(asio::io_context& io, RunOptions options, std::string mpirun, Say say)
    : io_(io),
      options_(std::move(options)),
      mpirun_(std::move(mpirun)),
      say_(std::move(say)),
      timer_(io),
      deadline_(io) {}

HostProbe::~HostProbe() { stop(); }

void HostProbe::start(Hosts hosts, Answered answered) {
  hosts_ = std::move(hosts);
  answered_ = std::move(answered);
  all_answered_ = nullptr;
  waiting_.clear();
  active_ = true;
  failed_ = 0;
  if (!job_) schedule();  // a probe in flight schedules the next one when it ends
}

void HostProbe::start_all(std::vector<std::string> hosts, std::function<void()> all_answered) {
  waiting_ = std::move(hosts);
  all_answered_ = std::move(all_answered);
  answered_ = nullptr;
  active_ = true;
  failed_ = 0;
  if (waiting_.empty()) {
    active_ = false;
    return asio::post(io_, [done = all_answered_] { done(); });
  }
  if (!job_) schedule();
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
    if (all_answered_) return probe(waiting_.front());
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
  deadline_.expires_after(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::max(Seconds(10), options_.probe_interval)));
  deadline_.async_wait([this](boost::system::error_code ec) {
    if (!ec && job_) job_->signal_group(SIGKILL);
  });
  job_->on_exit([this, host](int status) {
    deadline_.cancel();
    asio::post(io_, [this] { job_.reset(); });  // not from inside its own callback
    if (!active_) return;
    if (status != 0) {
      ++failed_;
      return schedule();
    }
    if (all_answered_) {
      std::erase(waiting_, host);
      if (!waiting_.empty()) return schedule();  // the next host, once this probe is reaped
      active_ = false;
      return all_answered_();
    }
    active_ = false;
    answered_(host);
  });
}

namespace {
// The path of the newest "ckpt-<9 digits>.h5" in `dir` and its step, or step -1.
std::pair<std::filesystem::path, long long> newest_checkpoint(const std::string& dir) {
  std::pair<std::filesystem::path, long long> newest{{}, -1};
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    // Exactly nine digits, as the writer names them: a stray name is not a checkpoint.
    if (name.size() != 17 || name.rfind("ckpt-", 0) != 0 || name.substr(14) != ".h5") continue;
    const std::string digits = name.substr(5, 9);
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (const long long step = std::stoll(digits); step > newest.second) newest = {entry.path(), step};
  }
  return newest;
}
}  // namespace

long long newest_checkpoint_step(const std::string& dir) { return newest_checkpoint(dir).second; }

std::string checkpoint_space_shortfall(const std::string& dir) {
  if (dir.empty()) return {};
  const auto [path, step] = newest_checkpoint(dir);
  std::error_code ec;
  const std::uintmax_t needed = step < 0 ? 0 : std::filesystem::file_size(path, ec);
  struct statvfs info {};
  if (needed == 0 || ec || ::statvfs(dir.c_str(), &info) != 0) return {};
  std::uintmax_t free_bytes = static_cast<std::uintmax_t>(info.f_bavail) * info.f_frsize;
  // What the job's dead writers left (".ckpt-<step>.h5.tmp-..." of a killed save,
  // ".going-..." of an old checkpoint being deleted) is room too: the relaunch's first
  // save deletes it before checking (CheckpointDirectory::check_free_space).
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".ckpt-", 0) == 0 &&
        (name.find(".h5.tmp-") != std::string::npos || name.find(".h5.going-") != std::string::npos))
      if (const std::uintmax_t size = entry.file_size(ec); !ec) free_bytes += size;
  }
  if (free_bytes >= needed) return {};
  return dir + " has " + std::to_string(free_bytes) + " bytes free and its newest checkpoint (" +
         path.filename().string() + ") took " + std::to_string(needed) + ": a relaunch would fail its saves again";
}

}  // namespace troupe::supervisor
