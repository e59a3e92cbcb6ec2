#include "troupe/supervisor/client.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <iterator>

#include "troupe/error.hpp"
#include "troupe/supervisor/protocol.hpp"
#include "troupe/supervisor/rank_dump.hpp"

namespace troupe::supervisor {
namespace {

// The client whose rank writes a dump as it crashes. A signal handler can reach nothing
// else, so this is the one process-wide pointer: set by the first client with a
// checkpoint folder, cleared when it goes.
std::atomic<SupervisorClient*> crash_client{nullptr};
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction crash_previous[std::size(kCrashSignals)];

const char* crash_signal_name(int signal) {
  switch (signal) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "a signal";
  }
}

void on_crash_signal(int signal, siginfo_t* info, void*) {
  static std::atomic<bool> dumping{false};
  if (!dumping.exchange(true)) {
    if (SupervisorClient* client = crash_client.load()) {
      ::alarm(15);  // a dump stuck on a lock the crash left held must not keep a dead rank alive
      client->write_crash_dump(signal, info != nullptr ? info->si_addr : nullptr);
      ::alarm(0);
    }
  }
  // The signal ends the process as it would have: the handler that was there (a
  // sanitizer's), or the default action, runs when this one returns (a fault) or at once.
  for (std::size_t i = 0; i < std::size(kCrashSignals); ++i)
    if (kCrashSignals[i] == signal) ::sigaction(signal, &crash_previous[i], nullptr);
  ::raise(signal);
}

// "host:port" or "[v6]:port" -> (host, port).
std::pair<std::string, std::string> split_address(const std::string& address) {
  auto colon = address.rfind(':');
  TROUPE_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size(), kEnvSupervisor, "='", address,
               "' is not host:port");
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, address.substr(colon + 1)};
}

void set_timeout(int fd, int option, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}

// Connects to the first address of `address` that answers. SO_SNDTIMEO bounds
// connect() on Linux, so an unreachable --bind address fails instead of hanging.
int connect_to(const std::string& address, std::chrono::milliseconds timeout) {
  auto [host, port] = split_address(address);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    TROUPE_THROW(Error, "supervisor client: cannot resolve ", address, " (", kEnvSupervisor, "): ", ::gai_strerror(rc));
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    set_timeout(fd, SO_SNDTIMEO, timeout);
    set_timeout(fd, SO_RCVTIMEO, timeout);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0)
    TROUPE_THROW(Error, "supervisor client: cannot connect to troupe-run at ", address, " (", kEnvSupervisor,
                 "): ", last_error);
  int one = 1;  // heartbeats are tiny; do not let Nagle hold them back
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

bool read_exactly(int fd, std::uint8_t* data, std::size_t n) {
  while (n > 0) {
    ssize_t got = ::recv(fd, data, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    data += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

}  // namespace

SupervisorClient::SupervisorClient(const RunEnvironment& env, int rank, int world_size,
                                   std::chrono::milliseconds timeout, LostHandler on_lost)
    : address_(env.supervisor),
      checkpoint_dir_(env.checkpoint_dir),
      rank_(rank),
      world_size_(world_size),
      restart_(env.restart),
      interval_(env.heartbeat_interval),
      supervisor_timeout_(env.supervisor_timeout),
      on_lost_(std::move(on_lost)) {
  TROUPE_CHECK(env.supervised(), "SupervisorClient: ", kEnvSupervisor, " is not set (not under troupe-run)");
  TROUPE_CHECK(rank >= 0 && rank < world_size, "SupervisorClient: rank ", rank, " not in a world of ", world_size);
  Hello hello{env.token,
              env.run_id,
              env.restart,
              static_cast<std::uint32_t>(rank),
              static_cast<std::uint32_t>(world_size),
              static_cast<std::uint32_t>(::getpid()),
              host_name()};
  // An eviction says troupe-run was flooded while this Hello was on its way, not that
  // the rank is unwelcome: connect again, a little later each time, until `timeout`.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::chrono::milliseconds pause{10};; pause = std::min(2 * pause, std::chrono::milliseconds(200))) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    bool evicted = false;
    std::string failure = register_once(hello, std::max(left, std::chrono::milliseconds(1)), evicted);
    if (failure.empty()) break;
    if (!evicted || left <= pause) TROUPE_THROW(Error, "supervisor client (", address_, "): ", failure);
    std::this_thread::sleep_for(pause);
  }
  uncaught_at_start_ = std::uncaught_exceptions();
  last_answer_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { heartbeat_loop(); });
  if (!checkpoint_dir_.empty()) install_crash_handler();
}

void SupervisorClient::install_crash_handler() noexcept {
  SupervisorClient* none = nullptr;
  if (!crash_client.compare_exchange_strong(none, this)) return;  // another client has it
  struct sigaction action {};
  action.sa_sigaction = on_crash_signal;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < std::size(kCrashSignals); ++i) ::sigaction(kCrashSignals[i], &action, &crash_previous[i]);
}

void SupervisorClient::remove_crash_handler() noexcept {
  if (crash_client.load() != this) return;
  for (std::size_t i = 0; i < std::size(kCrashSignals); ++i) ::sigaction(kCrashSignals[i], &crash_previous[i], nullptr);
  crash_client.store(nullptr);
}

void SupervisorClient::write_crash_dump(int signal, const void* address) noexcept {
  try {
    std::vector<std::string> flight;
    {
      std::lock_guard lock(recorder_mutex_);
      if (flight_recorder_) flight = flight_recorder_();
    }
    char where[32];
    std::snprintf(where, sizeof where, "0x%" PRIxPTR, reinterpret_cast<std::uintptr_t>(address));
    const std::string header = dump_header() + "\ncrashed: " + crash_signal_name(signal) + " (address " + where +
                               ") in thread " + std::to_string(::gettid());
    const std::string path = crash_dump_path(checkpoint_dir_, rank_);
    const std::string problem = write_rank_dump(path, header, flight);
    const std::string line = "troupe: rank " + std::to_string(rank_) + " crashed with " + crash_signal_name(signal) +
                             "; its stacks and last collectives: " + path +
                             (problem.empty() ? "" : " (" + problem + ")") + "\n";
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  } catch (...) {  // nothing more to do on a crashing rank
  }
}

std::unique_ptr<SupervisorClient> SupervisorClient::connect_if_supervised(const RunEnvironment& env, int rank,
                                                                          int world_size) {
  if (!env.supervised()) return nullptr;
  return std::make_unique<SupervisorClient>(env, rank, world_size);
}

SupervisorClient::~SupervisorClient() {
  remove_crash_handler();
  if (std::uncaught_exceptions() > uncaught_at_start_)
    abandon();
  else
    close();
}

std::string SupervisorClient::register_once(const Hello& hello, std::chrono::milliseconds timeout, bool& evicted) {
  fd_ = connect_to(address_, timeout);
  std::uint8_t header[kFrameHeader];
  std::vector<std::uint8_t> payload;
  std::string failure;
  if (!send_frame(encode(hello))) {
    failure = std::string("cannot send hello: ") + std::strerror(errno);
  } else if (!read_exactly(fd_, header, kFrameHeader)) {
    failure = "troupe-run closed the connection without answering hello";
  } else {
    try {
      payload.resize(decode_length(header));
      if (!read_exactly(fd_, payload.data(), payload.size())) {
        failure = "troupe-run's answer to hello was cut short";
      } else {
        Message answer = decode_payload(payload.data(), payload.size());
        if (auto* refused = std::get_if<Refused>(&answer)) {
          failure = "troupe-run refused rank " + std::to_string(hello.rank) + ": " + refused->reason;
          evicted = refused->reason.starts_with(kEvictedReason);
        } else if (!std::holds_alternative<Welcome>(answer))
          failure = "troupe-run answered hello with " + std::string(kind_name(answer));
      }
    } catch (const FormatError& e) {
      failure = e.what();
    }
  }
  if (!failure.empty()) {
    ::close(fd_);
    fd_ = -1;
  }
  return failure;
}

void SupervisorClient::abandon(std::string_view why) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    if (!why.empty() && fd_ >= 0) {
      try {
        send_frame(encode(Notice{NoticeKind::error, std::string(why.substr(0, kMaxNoticeText))}));
      } catch (...) {  // an allocation failure: the connection still closes without goodbye
      }
    }
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    discard_answers(std::chrono::milliseconds(0));
    ::close(fd_);
    fd_ = -1;
  }
}

// Reads and drops troupe-run's unread answers, for up to `linger` or until it closes.
// Closing a socket with unread bytes sends RST instead of FIN, and an RST can make
// troupe-run lose a Goodbye it has not read yet: a clean end would look like a crash.
void SupervisorClient::discard_answers(std::chrono::milliseconds linger) noexcept {
  const auto until = std::chrono::steady_clock::now() + linger;
  std::uint8_t buffer[256];
  for (;;) {
    ssize_t got = ::recv(fd_, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got > 0) continue;
    if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left.count()));
  }
}

bool SupervisorClient::send_frame(const std::vector<std::uint8_t>& frame) noexcept {
  std::size_t done = 0;
  while (done < frame.size()) {
    // MSG_NOSIGNAL: a supervisor that went away must not SIGPIPE the rank.
    ssize_t n = ::send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

void SupervisorClient::report_notice(NoticeKind kind, const std::string& text) noexcept {
  std::lock_guard lock(mutex_);
  if (stop_ || fd_ < 0) return;
  try {
    send_frame(encode(Notice{kind, text.substr(0, kMaxNoticeText)}));
  } catch (...) {  // an allocation failure: the notice is lost, the rank goes on
  }
}

void SupervisorClient::heartbeat_loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    Heartbeat beat;
    std::uint64_t step = step_.load(std::memory_order_relaxed);
    std::uint64_t sequence = sequence_.load(std::memory_order_relaxed);
    beat.has_step = step != kUnset;
    beat.has_sequence = sequence != kUnset;
    beat.step = beat.has_step ? step : 0;
    beat.sequence = beat.has_sequence ? sequence : 0;
    beat.phase = phase();
    beat.work_steps = work_steps_.load(std::memory_order_acquire);  // then the time: it covers those steps
    beat.work_us = work_us_.load(std::memory_order_relaxed);
    std::string lost;
    if (!send_frame(encode(beat)))
      lost = std::string("heartbeats to troupe-run at ") + address_ + " failed: " + std::strerror(errno);
    else
      lost = check_answers();
    if (!lost.empty()) {
      lock.unlock();
      return lose_supervisor(lost);
    }
    sent_.fetch_add(1, std::memory_order_relaxed);
    wake_.wait_for(lock, interval_, [this] { return stop_ || first_step_; });
    first_step_ = false;
  }
}

std::string SupervisorClient::check_answers() {
  auto now = std::chrono::steady_clock::now();
  std::uint8_t buffer[256];
  for (;;) {  // Alive and Stop frames come after Welcome
    ssize_t got = ::recv(fd_, buffer, sizeof buffer, MSG_DONTWAIT);
    if (got > 0) {
      last_answer_ = now;
      answers_.insert(answers_.end(), buffer, buffer + got);
      continue;
    }
    if (got == 0) return "troupe-run at " + address_ + " closed the connection";
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return "the connection to troupe-run at " + address_ + " failed: " + std::strerror(errno);
  }
  while (answers_.size() >= kFrameHeader) {
    std::size_t length = 0;
    try {
      length = decode_length(answers_.data());
    } catch (const FormatError& e) {
      return std::string("troupe-run at ") + address_ + " sent a malformed frame: " + e.what();
    }
    if (answers_.size() < kFrameHeader + length) break;
    if (answers_[kFrameHeader] == static_cast<std::uint8_t>(MessageKind::stop))
      return "troupe-run at " + address_ + " is stopping the job";
    if (answers_[kFrameHeader] == static_cast<std::uint8_t>(MessageKind::dump)) write_dump();
    answers_.erase(answers_.begin(), answers_.begin() + static_cast<std::ptrdiff_t>(kFrameHeader + length));
  }
  if (supervisor_timeout_.count() > 0 && now - last_answer_ > supervisor_timeout_)
    return "no answer from troupe-run at " + address_ + " for " +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - last_answer_).count()) +
           " ms: it has given this rank up (a partition) or is gone, and relaunches the job without it; ending "
           "this rank so that the job is not left in two halves";
  return {};
}

void SupervisorClient::set_flight_recorder(std::function<std::vector<std::string>()> record) {
  std::lock_guard lock(recorder_mutex_);
  flight_recorder_ = std::move(record);
}

void SupervisorClient::write_dump() noexcept {
  if (checkpoint_dir_.empty()) return;  // troupe-run asks only when it has a folder
  try {
    std::vector<std::string> flight;
    {
      std::lock_guard lock(recorder_mutex_);
      if (flight_recorder_) flight = flight_recorder_();
    }
    const std::string problem = write_rank_dump(dump_path(checkpoint_dir_, rank_), dump_header(), flight);
    if (!problem.empty()) std::cerr << "troupe supervisor client: rank " << rank_ << "'s dump: " << problem << "\n";
  } catch (const std::exception& e) {
    std::cerr << "troupe supervisor client: rank " << rank_ << " could not write its dump: " << e.what() << "\n";
  }
}

std::string SupervisorClient::dump_header() const {
  const std::uint64_t step = step_.load(std::memory_order_relaxed);
  return "troupe rank dump: rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + ", pid " +
         std::to_string(::getpid()) + ", host " + host_name() + ", restart " + std::to_string(restart_) + ", phase " +
         std::string(phase_name(phase())) + (step == kUnset ? std::string() : ", step " + std::to_string(step));
}

void SupervisorClient::lose_supervisor(const std::string& why) {
  if (supervisor_timeout_.count() <= 0) {  // not asked to fence: the program goes on
    std::cerr << "troupe supervisor client: heartbeats stopped: " << why << "\n";
    return;
  }
  if (on_lost_) return on_lost_(why);
  std::cerr << "troupe supervisor client: " << why << "\n" << std::flush;
  ::kill(::getpid(), SIGKILL);
}

void SupervisorClient::wake_first_step() noexcept {
  {
    std::lock_guard lock(mutex_);
    first_step_ = true;
  }
  wake_.notify_all();
}

void SupervisorClient::close() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    try {
      send_frame(encode(Goodbye{}));
    } catch (...) {
    }
    ::shutdown(fd_, SHUT_WR);
    discard_answers(std::chrono::milliseconds(500));  // troupe-run closes once it has read the Goodbye
    ::close(fd_);
    fd_ = -1;
  }
}

}  // namespace troupe::supervisor
