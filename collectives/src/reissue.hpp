// Reissues a call a backend was handed through another communicator's public front end,
// for backends that carry some calls over a host communicator (NCCL's host buffers, the
// staged backend's copies). The host numbers and checks the call in its own sequence,
// so its own calls (a split's allgather) cannot collide with numbers the outer
// communicator gave; handing the call to the host's backend under the outer number did,
// at the first split after a host call. Blocking calls take the blocking forms, whose
// routes may finish on the calling thread.
#pragma once

#include "troupe/collectives/communicator.hpp"

namespace troupe::collectives::detail {

Work reissue(Communicator& host, const Collective& call, bool blocking);

}  // namespace troupe::collectives::detail
