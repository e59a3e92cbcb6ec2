// Who writes in a checkpoint folder, as far as one host can tell: its own name, and
// whether a process of its own still runs. A process on another host cannot be seen
// from here, so what it left is treated as live until a lease says otherwise.
#pragma once

#include <sys/types.h>

#include <string>

namespace troupe::checkpoint::detail {

// This host's name with letters, digits, '.' and '_' only (others become '_').
const std::string& this_host();
// Whether local `pid` no longer runs: it does not exist, or it is a zombie.
bool process_gone(pid_t pid);

}  // namespace troupe::checkpoint::detail
