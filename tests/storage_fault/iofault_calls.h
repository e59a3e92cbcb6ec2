// Between the shim's core (iofault.c: the spec, the counters, the fd table) and its
// libc wrappers (iofault_calls.c). Hidden: nothing here is exported from the .so.
#ifndef TROUPE_IOFAULT_CALLS_H
#define TROUPE_IOFAULT_CALLS_H

#include <stddef.h>

#pragma GCC visibility push(hidden)

// The next definition of `name` (libc's), cached in *slot. NULL while the calling thread
// is inside the shim's own loading or dlsym: the wrapper then makes the raw syscall.
void* iofault_real(const char* name, void* _Atomic* slot);

// A call naming a path (resolved against dirfd, or the cwd for AT_FDCWD): counts it
// when watched (*watched = 1) and returns the errno to fail it with, or 0.
int iofault_on_path(int op, int dirfd, const char* path, int* watched);

// rename: watched when either name is under the prefix.
int iofault_on_rename(int old_dirfd, const char* old_path, int new_dirfd, const char* new_path);

// A call on a descriptor: counts it when the fd is watched; returns the errno to fail
// with, or 0, after halving *bytes for err=short (bytes may be NULL, as for fsync).
int iofault_on_fd(int op, int fd, size_t* bytes);

int iofault_fd_watched(int fd);
void iofault_mark_fd(int fd, int watched);
void iofault_clear_fds(unsigned first, unsigned last);

#pragma GCC visibility pop

#endif
