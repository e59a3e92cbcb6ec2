// What libtroupe_iofault.so is told to do, read once from the environment
// (docs/TESTING.md, "Storage faults"):
//
//   TROUPE_IOFAULT=path=PREFIX[,op=KIND,nth=N[,count=K][,err=NAME][,stall_ms=M]]
//   TROUPE_IOFAULT_COUNTS=FILE   (optional: per-kind call counts appended at exit)
//
// Only calls on paths under PREFIX are counted; the Nth..N+K-1th call of KIND fails
// with NAME (or is cut short), after a stall of M ms when one is given.
#ifndef TROUPE_IOFAULT_SPEC_H
#define TROUPE_IOFAULT_SPEC_H

#include <limits.h>
#include <stddef.h>

#pragma GCC visibility push(hidden)  // the shim exports only the libc names it replaces

// The kinds of call that are counted. Each libc call the shim interposes belongs to one.
enum iofault_op {
  IOFAULT_OPEN,
  IOFAULT_READ,
  IOFAULT_WRITE,
  IOFAULT_FSYNC,
  IOFAULT_RENAME,
  IOFAULT_UNLINK,
  IOFAULT_OPS
};

// err=short: not an errno, the call transfers half the bytes asked.
#define IOFAULT_SHORT (-1)

struct iofault_spec {
  int active;                  // 0: the shim only forwards (neither variable set)
  char prefix[PATH_MAX];       // absolute, lexically normalised; a trailing '/' is kept
  int op;                      // an iofault_op, or -1: count only, fail nothing
  unsigned long nth;           // 1-based index of the first call of `op` that misbehaves
  unsigned long count;         // how many calls from nth misbehave; 0: all of them
  int err;                     // errno to fail with, IOFAULT_SHORT, or 0: only stall
  long stall_ms;               // sleep before each misbehaving call; 0: none
  char counts_path[PATH_MAX];  // TROUPE_IOFAULT_COUNTS, or "" for none
};

// Parses TROUPE_IOFAULT's text (NULL when unset) and TROUPE_IOFAULT_COUNTS (NULL when
// unset) into *out. Returns 0, or -1 with a one-line reason in why[why_len].
int iofault_parse(const char* text, const char* counts, struct iofault_spec* out, char* why, size_t why_len);

// "open", "read", ... for an iofault_op.
const char* iofault_op_name(int op);

// "ENOSPC", ... for an errno the spec accepts, "short" for IOFAULT_SHORT, else "errno N"
// (written into buf, which must hold 24 bytes).
const char* iofault_err_name(int err, char* buf);

// Makes `path` absolute against `base` (used when it is relative) and removes ".", ".."
// and repeated '/' lexically (no symlinks are followed). Returns 0, or -1 when the
// result does not fit in out[out_len].
int iofault_absolute(const char* base, const char* path, char* out, size_t out_len);

#pragma GCC visibility pop

#endif
