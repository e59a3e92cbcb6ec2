// Memory kept on purpose until the process exits: what a collective abandoned after a
// timeout may still be written or read by MPI (or a late peer) is never freed. In the
// sanitized test builds LeakSanitizer is told so, and reports only real leaks; in
// other builds this does nothing.
#pragma once

extern "C" void __lsan_ignore_object(const void* p) __attribute__((weak));

namespace troupe::detail {

// `p` points into a heap object (anywhere in it) that is kept, with everything it
// reaches, for the rest of the process.
inline void keep_until_exit(const void* p) {
  if (p != nullptr && __lsan_ignore_object != nullptr) __lsan_ignore_object(p);
}

}  // namespace troupe::detail
