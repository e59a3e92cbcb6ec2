#include "troupe/checkpoint/checkpoint_directory.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>

#include "durable_file.hpp"
#include "troupe/checkpoint/error.hpp"

namespace troupe::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "ckpt-";
constexpr std::string_view kSuffix = ".h5";
constexpr std::string_view kTempMark = ".tmp-";
constexpr const char* kLatest = "latest";

std::string file_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%09lld.h5", static_cast<long long>(step));
  return buf;
}

// The pid in ".ckpt-000000042.h5.tmp-1234" (or ".../latest.tmp-1234"), if the name is one.
std::optional<pid_t> temp_owner(const std::string& name) {
  auto at = name.rfind(kTempMark);
  if (at == std::string::npos) return std::nullopt;
  bool ours = (name.rfind(".ckpt-", 0) == 0) || name.rfind(std::string(kLatest) + ".tmp-", 0) == 0;
  if (!ours) return std::nullopt;
  std::string digits = name.substr(at + kTempMark.size());
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return static_cast<pid_t>(std::stol(digits));
}

// Whether `pid` no longer runs: it does not exist (kill(pid, 0) fails with ESRCH) or it
// is a zombie. A writer killed with SIGKILL stays a zombie until its parent reaps it,
// and under mpirun that parent may itself be gone, leaving the reaping to an init that
// takes its time: the job is relaunched before then.
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces and ')'
  return paren != std::string::npos && paren + 2 < line.size() &&
         (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
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
  TROUPE_CHECK(step >= 0 && step <= 999'999'999, "checkpoint: step ", step,
               " does not fit the 9-digit file name");
  return folder_ / file_name(step);
}

fs::path CheckpointDirectory::temp_path(std::int64_t step) const {
  std::string name = ".";
  name += file_name(step);
  name += kTempMark;
  name += std::to_string(::getpid());
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
    if (others.size() + 1 > keep_last_) {
      for (std::size_t i = 0; i + keep_last_ - 1 < others.size(); ++i) {
        std::error_code ec;
        fs::remove(others[i], ec);  // a file someone else removed first is not an error
      }
      detail::fsync_path(folder_);
    }
  }
  remove_debris();
  return final;
}

std::vector<fs::path> CheckpointDirectory::list() const {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder_, ec))
    if (auto step = step_of(entry.path()); step && entry.is_regular_file(ec))
      found.emplace_back(*step, entry.path());
  if (ec)
    TROUPE_THROW(CheckpointError, "checkpoint: cannot list ", folder_.string(), ": ", ec.message());
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
    std::optional<pid_t> owner = temp_owner(entry.path().filename().string());
    if (!owner || *owner == ::getpid()) continue;  // our own temp files are saves in flight
    if (!process_gone(*owner)) continue;
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
  return removed;
}

}  // namespace troupe::checkpoint
