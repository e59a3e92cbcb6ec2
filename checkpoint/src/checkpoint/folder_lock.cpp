#include "troupe/checkpoint/folder_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include "process_identity.hpp"
#include "troupe/checkpoint/error.hpp"

namespace troupe::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockName = ".troupe-lock";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::chrono::milliseconds lease_from_environment() {
  const char* text = std::getenv("TROUPE_LOCK_LEASE_S");
  if (!text || !*text) return std::chrono::seconds(60);
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  TROUPE_CHECK(end && *end == '\0' && seconds > 0 && seconds <= 86400, "TROUPE_LOCK_LEASE_S='", text,
               "': expected seconds above 0, at most 86400");
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

// "run=<id> host=<host> pid=<pid> lease_until=<seconds>"; nullopt for anything else (an
// empty file, a stray one): no owner.
std::optional<FolderLock::Owner> parse(const std::string& line) {
  FolderLock::Owner owner;
  std::istringstream in(line);
  int fields = 0;
  for (std::string token; in >> token;) {
    const auto eq = token.find('=');
    if (eq == std::string::npos) return std::nullopt;
    const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
    char* end = nullptr;
    if (key == "run")
      owner.run_id = value;
    else if (key == "host")
      owner.host = value;
    else if (key == "pid")
      owner.pid = static_cast<pid_t>(std::strtol(value.c_str(), &end, 10));
    else if (key == "lease_until")
      owner.lease_until = std::strtod(value.c_str(), &end);
    else
      return std::nullopt;
    if (end && *end != '\0') return std::nullopt;
    ++fields;
  }
  if (fields != 4 || owner.pid <= 0) return std::nullopt;
  return owner;
}

std::optional<FolderLock::Owner> read_owner(int fd) {
  std::string text(256, '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  if (n <= 0) return std::nullopt;
  text.resize(static_cast<std::size_t>(n));
  return parse(text.substr(0, text.find('\n')));
}

std::string describe(const FolderLock::Owner& owner) {
  std::ostringstream out;
  out << "run '" << owner.run_id << "' (host " << owner.host << ", pid " << owner.pid << ", lease for "
      << static_cast<long long>(owner.lease_until - now_seconds()) << " s more)";
  return out.str();
}

// Whether `owner` may be taken over now by run `run_id` on this host.
bool stale(const FolderLock::Owner& owner, const std::string& run_id) {
  if (owner.lease_until <= now_seconds()) return true;
  if (!run_id.empty() && owner.run_id == run_id) return true;
  return owner.host == detail::this_host() && detail::process_gone(owner.pid);
}

}  // namespace

FolderLock::FolderLock(const fs::path& folder, std::string run_id, std::optional<std::chrono::milliseconds> lease)
    : path_(folder / kLockName), run_id_(std::move(run_id)), lease_(lease.value_or(lease_from_environment())) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_os_error("open", path_.string(), errno);
  const auto refuse = [&](const Owner& owner) {
    ::close(fd_);
    fd_ = -1;
    TROUPE_THROW(CheckpointError, "checkpoint folder ", folder.string(), " is in use by ", describe(owner),
                 ": two jobs in one folder would overwrite each other's checkpoints. Use another folder, or stop ",
                 "that job (a lock whose owner died is taken over when its lease runs out)");
  };
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) refuse(read_owner(fd_).value_or(Owner{"?", "?", 0, 0}));
    // ENOLCK/EOPNOTSUPP: a file system without locks; the lease alone decides.
    if (err != ENOLCK && err != EOPNOTSUPP) {
      ::close(fd_);
      throw_os_error("flock", path_.string(), err);
    }
  }
  // The flock is ours, or cannot be had here: a holder on another host shows only in
  // its lease. One still running is waited out, unless its owner renews it.
  const auto deadline = std::chrono::steady_clock::now() + lease_ + std::chrono::seconds(1);
  for (std::optional<Owner> owner = read_owner(fd_); owner && !stale(*owner, run_id_);) {
    if (std::chrono::steady_clock::now() > deadline) refuse(*owner);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::optional<Owner> again = read_owner(fd_);
    if (again && again->lease_until > owner->lease_until + 1e-3 && !stale(*again, run_id_)) refuse(*again);  // renewed
    owner = again;
  }
  write_record(now_seconds() + std::chrono::duration<double>(lease_).count());
  renewer_ = std::thread([this] { renew_loop(); });
}

FolderLock::~FolderLock() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (renewer_.joinable()) renewer_.join();
  if (fd_ < 0) return;
  try {
    write_record(0);        // released: the next job need not wait out the lease
  } catch (const Error&) {  // the lease then runs out by itself
  }
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

std::optional<FolderLock::Owner> FolderLock::owner_of(const fs::path& folder) {
  const int fd = ::open((folder / kLockName).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<Owner> owner = read_owner(fd);
  ::close(fd);
  return owner;
}

void FolderLock::write_record(double lease_until) {
  std::ostringstream line;
  line.precision(15);
  line << "run=" << (run_id_.empty() ? "-" : run_id_) << " host=" << detail::this_host() << " pid=" << ::getpid()
       << " lease_until=" << lease_until << "\n";
  const std::string text = line.str();
  if (::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    throw_os_error("pwrite", path_.string(), errno ? errno : EIO);
  if (::ftruncate(fd_, static_cast<off_t>(text.size())) != 0) throw_os_error("ftruncate", path_.string(), errno);
  if (::fdatasync(fd_) != 0) throw_os_error("fdatasync", path_.string(), errno);
}

void FolderLock::renew_loop() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, lease_ / 4, [this] { return stopping_; })) {
    try {
      write_record(now_seconds() + std::chrono::duration<double>(lease_).count());
    } catch (const Error&) {  // storage trouble: tried again at the next turn, before the lease ends
    }
  }
}

}  // namespace troupe::checkpoint
