#include "troupe/checkpoint/checkpoint_directory.hpp"

#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <future>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "durable_file.hpp"
#include "process_identity.hpp"
#include "troupe/checkpoint/error.hpp"

namespace troupe::checkpoint {

namespace fs = std::filesystem;
using detail::process_gone;
using detail::this_host;

namespace {

constexpr std::string_view kPrefix = "ckpt-";
constexpr std::string_view kSuffix = ".h5";
constexpr std::string_view kTempMark = ".tmp-";
constexpr std::string_view kGoingMark = ".going-";  // set aside by commit(), being deleted
constexpr const char* kLatest = "latest";
constexpr std::string_view kDamaged = ".damaged";

std::string file_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%09lld.h5", static_cast<long long>(step));
  return buf;
}

// Who writes the temporary file ".ckpt-000000042.h5.tmp-<host>-<pid>" (or deletes the
// set-aside ".ckpt-000000042.h5.going-<host>-<pid>": `mark` is ".going-"). Names without
// a host ("latest.tmp-<pid>", and older troupes' checkpoint temporaries) are this host's.
struct TempOwner {
  std::string host;
  pid_t pid;
};

std::optional<TempOwner> temp_owner(const std::string& name, std::string_view mark = kTempMark) {
  auto at = name.rfind(mark);
  if (at == std::string::npos) return std::nullopt;
  bool ours = (name.rfind(".ckpt-", 0) == 0) || name.rfind(std::string(kLatest) + ".tmp-", 0) == 0;
  if (!ours) return std::nullopt;
  std::string_view rest = std::string_view(name).substr(at + mark.size());
  std::string host = this_host();
  if (const auto dash = rest.rfind('-'); dash != std::string_view::npos) {
    host = std::string(rest.substr(0, dash));
    rest.remove_prefix(dash + 1);
  }
  // A stray name must not crash a resume: digits that do not fit a pid are not ours.
  long long pid = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  if (rest.empty() || error != std::errc() || end != rest.data() + rest.size() || pid <= 0 ||
      pid > std::numeric_limits<pid_t>::max())
    return std::nullopt;
  return TempOwner{std::move(host), static_cast<pid_t>(pid)};
}

}  // namespace

CheckpointDirectory::CheckpointDirectory(fs::path folder, std::size_t keep_last)
    : folder_(std::move(folder)), keep_last_(keep_last) {
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (ec || !fs::is_directory(folder_))
    TROUPE_THROW(CheckpointError, "checkpoint: cannot use folder ", folder_.string(), ": ",
                 ec ? ec.message() : std::string("not a directory"));
}

fs::path CheckpointDirectory::final_path(std::int64_t step) const {
  TROUPE_CHECK(step >= 0 && step <= 999'999'999, "checkpoint: step ", step, " does not fit the 9-digit file name");
  return folder_ / file_name(step);
}

fs::path CheckpointDirectory::temp_path(std::int64_t step) const {
  std::string name = ".";
  name += file_name(step);
  name += kTempMark;
  name += this_host() + "-" + std::to_string(::getpid());
  return folder_ / name;
}

fs::path CheckpointDirectory::going_path(const fs::path& file) const {
  std::string name = ".";
  name += file.filename().string();
  name += kGoingMark;
  name += this_host() + "-" + std::to_string(::getpid());
  return folder_ / name;
}

std::optional<std::int64_t> CheckpointDirectory::step_of(const fs::path& file) {
  std::string name = file.filename().string();
  if (name.size() != kPrefix.size() + 9 + kSuffix.size() || name.rfind(kPrefix, 0) != 0 ||
      name.substr(kPrefix.size() + 9) != kSuffix)
    return std::nullopt;
  std::string digits = name.substr(kPrefix.size(), 9);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(digits);
}

fs::path CheckpointDirectory::commit(const fs::path& temp, std::int64_t step) {
  wait_for_removals();
  fs::path final = final_path(step);
  // 1. the bytes, 2. the name, 3. the name's directory entry: each durable before the next.
  detail::fsync_path(temp);
  detail::durable_rename(temp, final);
  detail::write_text_durably(folder_ / kLatest, final.filename().string() + "\n");
  // Only now is it safe to let older checkpoints go. The new file always stays, even
  // when files of higher steps exist (a run that resumed from an earlier checkpoint and
  // is saving again): it is what `latest` names. Of the others, the highest steps stay.
  if (keep_last_ > 0) {
    std::vector<fs::path> others;
    for (fs::path& p : list())
      if (p != final) others.push_back(std::move(p));
    // Renamed aside at once (no listing or load sees them again), deleted on a thread:
    // freeing a large file's blocks takes tens of milliseconds (ext4: ~40 ms for 300 MB)
    // that the save need not wait for, as torchtitan purges on a thread of its own. A
    // crash before the deletion leaves a set-aside file, which the next commit deletes.
    std::vector<fs::path> going;
    for (std::size_t i = 0; i + keep_last_ - 1 < others.size(); ++i) {
      fs::path aside = going_path(others[i]);
      // A file someone else removed first is not an error.
      if (::rename(others[i].c_str(), aside.c_str()) == 0) going.push_back(std::move(aside));
    }
    if (!going.empty()) {
      auto remove = [going = std::move(going), folder = folder_] {
        std::error_code ec;
        for (const fs::path& file : going) fs::remove(file, ec);
        try {
          detail::fsync_path(folder);
        } catch (const std::exception&) {  // not durable yet is harmless: a leftover is deleted later
        }
      };
      try {
        removal_ = std::async(std::launch::async, remove).share();
      } catch (const std::system_error&) {  // no thread to be had: the checkpoint is saved all the same
        remove();
      }
    }
  }
  remove_debris();
  return final;
}

void CheckpointDirectory::wait_for_removals() const {
  if (removal_.valid()) removal_.wait();
}

std::vector<fs::path> CheckpointDirectory::list() const {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder_, ec))
    if (auto step = step_of(entry.path()); step && entry.is_regular_file(ec)) found.emplace_back(*step, entry.path());
  if (ec) throw_os_error("opendir", folder_.string(), ec.value());
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::optional<fs::path> CheckpointDirectory::latest_pointer() const {
  std::ifstream in(folder_ / kLatest);
  std::string name;
  if (!in || !std::getline(in, name)) return std::nullopt;
  if (!step_of(name) || fs::path(name).filename() != name) return std::nullopt;
  fs::path path = folder_ / name;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  return path;
}

std::vector<fs::path> CheckpointDirectory::load_candidates() const {
  std::vector<fs::path> out;
  if (auto latest = latest_pointer()) out.push_back(*latest);
  std::vector<fs::path> all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (out.empty() || *it != out.front()) out.push_back(*it);
  return out;
}

std::vector<fs::path> CheckpointDirectory::debris() const {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder_, ec)) {
    std::optional<TempOwner> owner = temp_owner(entry.path().filename().string());
    // Our own temp files are saves in flight; another host's writer cannot be seen from
    // here, so its file may be a save in flight too.
    if (!owner || owner->host != this_host() || owner->pid == ::getpid()) continue;
    if (!process_gone(owner->pid)) continue;
    out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::size_t CheckpointDirectory::remove_debris() const {
  std::size_t removed = 0;
  std::error_code ec;
  for (const fs::path& file : debris())
    if (fs::remove(file, ec)) ++removed;
  // What an earlier commit set aside and did not get to delete (its process ended
  // first): never read again, so any but this process's own can go.
  for (const auto& entry : fs::directory_iterator(folder_, ec)) {
    std::optional<TempOwner> going = temp_owner(entry.path().filename().string(), kGoingMark);
    if (going && (going->host != this_host() || going->pid != ::getpid())) fs::remove(entry.path(), ec);
  }
  return removed;
}

void CheckpointDirectory::check_free_space() const {
  // The space they free counts, and so does what killed saves and deletions left.
  wait_for_removals();
  remove_debris();
  const std::vector<fs::path> files = list();
  if (files.empty()) return;
  std::error_code ec;
  const std::uintmax_t needed = fs::file_size(files.back(), ec);
  if (ec) return;  // gone meanwhile: nothing to compare with
  struct statvfs fs_info {};
  if (::statvfs(folder_.c_str(), &fs_info) != 0) throw_os_error("statvfs", folder_.string(), errno);
  const std::uintmax_t free_bytes = static_cast<std::uintmax_t>(fs_info.f_bavail) * fs_info.f_frsize;
  if (free_bytes < needed)
    TROUPE_THROW(StorageError, "checkpoint: ", folder_.string(), " has ", free_bytes, " bytes free, and the last ",
                 "checkpoint (", files.back().filename().string(), ") took ", needed, ": ", errno_text(ENOSPC),
                 " before writing, a storage error, not damage");
}

std::vector<fs::path> CheckpointDirectory::quarantined() const {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder_, ec)) {
    const std::string name = entry.path().filename().string();
    const auto at = name.find(kDamaged);
    if (at != std::string::npos && step_of(name.substr(0, at))) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

fs::path CheckpointDirectory::quarantine(const fs::path& file) const {
  fs::path target = file;
  target += kDamaged;
  for (int n = 2; fs::exists(target); ++n) {
    target = file;
    target += std::string(kDamaged) + "-" + std::to_string(n);
  }
  detail::durable_rename(file, target);
  return target;
}

bool CheckpointDirectory::has_history() const {
  std::error_code ec;
  return !list().empty() || fs::exists(folder_ / kLatest, ec) || !quarantined().empty();
}

fs::path CheckpointDirectory::supersede() const {
  std::vector<fs::path> moving = list();
  for (fs::path& p : quarantined()) moving.push_back(std::move(p));
  std::error_code ec;
  if (fs::exists(folder_ / kLatest, ec)) moving.push_back(folder_ / kLatest);
  if (moving.empty()) return {};
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  const fs::path aside = folder_ / ("superseded-" + std::string(stamp) + "-" + std::to_string(::getpid()));
  fs::create_directory(aside, ec);
  if (ec) throw_os_error("mkdir", aside.string(), ec.value());
  for (const fs::path& p : moving) {
    if (::rename(p.c_str(), (aside / p.filename()).c_str()) != 0)
      throw_os_error("rename", p.string() + " -> " + (aside / p.filename()).string(), errno);
  }
  detail::fsync_path(aside);
  detail::fsync_path(folder_);
  return aside;
}

}  // namespace troupe::checkpoint
