#include "process_identity.hpp"

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <fstream>

namespace troupe::checkpoint::detail {

const std::string& this_host() {
  static const std::string host = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string("unknown-host");
    std::string out(buf);
    for (char& c : out)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_') c = '_';
    return out.empty() ? std::string("unknown-host") : out;
  }();
  return host;
}

// A writer killed with SIGKILL stays a zombie until its parent reaps it, and under
// mpirun that parent may itself be gone, leaving the reaping to an init that takes its
// time: the job is relaunched before then.
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto paren = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces and ')'
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

}  // namespace troupe::checkpoint::detail
