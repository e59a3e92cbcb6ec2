// One step of a spin-wait, for the actors' scheduler and transport and the
// collectives' shared-memory waits.
#pragma once

#include <thread>

namespace troupe::detail {

// Tells the core that this thread waits: cheaper for the other hyperthread, no system
// call, and a polled cache line is not re-read at full speed while its owner is still
// writing it (each read would take the line back from the writer).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace troupe::detail
