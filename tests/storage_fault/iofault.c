// libtroupe_iofault.so: an LD_PRELOAD shim that makes storage fail on cue, so tests can
// show what a checkpoint writer does when the Nth write, fsync or rename of a save
// fails (iofault_spec.h has the variables, docs/TESTING.md "Storage faults" the use).
//
// Each interposed libc call is sorted into one kind (open, read, write, fsync, rename,
// unlink). A call on a watched path (under the prefix) bumps its kind's counter; the
// Nth..N+K-1th of the chosen kind stalls and/or fails. Path-taking calls are judged by
// the path, fd-taking calls by a table fd -> watched that the open family fills, dup
// copies and close clears.
//
// What is not seen, because glibc makes the call internally rather than through the
// symbol we replace: the reads and writes of a FILE* (fread, fwrite, fflush and the
// flush in fclose go to glibc's own __read/__write), fopen's own open (counted once as
// fopen), remove's unlink/rmdir (counted once as remove). libstdc++'s fstreams are seen
// whole: basic_file opens with fopen64 but reads and writes the descriptor with
// read/write/writev. Not counted at all: mmap'd I/O, sendfile, copy_file_range,
// ftruncate, and fds a process inherited across exec (the table starts empty).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "iofault_calls.h"
#include "iofault_spec.h"

static struct iofault_spec spec;  // written once, under `loaded`, before any reader
static atomic_ulong calls[IOFAULT_OPS];

// fd -> watched. One byte per descriptor up to Linux's default nr_open; untouched pages
// of .bss cost nothing. Descriptors above it are never watched.
enum { kFdSlots = 1 << 20 };
static atomic_uchar watched_fds[kFdSlots];

// Set while this thread is inside dlsym or the loader: calls made from there (an
// allocator reading /proc, dlsym's own needs) are forwarded as raw syscalls instead of
// recursing into a resolution or a pthread_once that is already under way.
static __thread int in_shim __attribute__((tls_model("initial-exec")));

static pthread_once_t loaded = PTHREAD_ONCE_INIT;

// The shim's own output bypasses every wrapper.
static void say(const char* line, size_t len) { syscall(SYS_write, 2, line, len); }

static void reset_counts_in_child(void) {
  // A forked child counts its own calls, as an exec'd one would.
  for (int op = 0; op < IOFAULT_OPS; ++op) atomic_store(&calls[op], 0);
}

static void load(void) {
  in_shim = 1;
  char why[2 * PATH_MAX + 128];
  const char* text = getenv("TROUPE_IOFAULT");
  if (iofault_parse(text, getenv("TROUPE_IOFAULT_COUNTS"), &spec, why, sizeof why) != 0) {
    char line[sizeof why + 2 * PATH_MAX + 64];
    int n = snprintf(line, sizeof line, "troupe-iofault: bad TROUPE_IOFAULT='%s': %s\n", text ? text : "", why);
    say(line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    abort();  // a test must never run without the fault it asked for
  }
  pthread_atfork(NULL, NULL, reset_counts_in_child);
  in_shim = 0;
}

__attribute__((constructor)) static void load_at_start(void) { pthread_once(&loaded, load); }

// Nonzero when the shim was told to watch something (loading it first if need be).
static int active(void) {
  if (in_shim) return 0;
  pthread_once(&loaded, load);
  return spec.active;
}

void* iofault_real(const char* name, void* _Atomic* slot) {
  void* fn = atomic_load_explicit(slot, memory_order_acquire);
  if (fn || in_shim) return fn;  // NULL while in_shim: the caller falls back to a syscall
  in_shim = 1;
  fn = dlsym(RTLD_NEXT, name);
  in_shim = 0;
  if (!fn) {
    char line[160];
    int n = snprintf(line, sizeof line, "troupe-iofault: libc has no '%s' (%s)\n", name, dlerror());
    say(line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    abort();
  }
  atomic_store_explicit(slot, fn, memory_order_release);
  return fn;
}

int iofault_fd_watched(int fd) {
  return fd >= 0 && fd < kFdSlots && atomic_load_explicit(&watched_fds[fd], memory_order_relaxed);
}

void iofault_mark_fd(int fd, int watched) {
  if (fd >= 0 && fd < kFdSlots) atomic_store_explicit(&watched_fds[fd], (unsigned char)watched, memory_order_relaxed);
}

void iofault_clear_fds(unsigned first, unsigned last) {
  for (unsigned long fd = first; fd <= last && fd < kFdSlots; ++fd) atomic_store(&watched_fds[fd], 0);
}

// The absolute path a call names: `path` against the cwd, or against the directory
// `dirfd` is open on. Returns 0 when that path is under the prefix, 1 when it is not,
// -1 when it cannot be made absolute (then it is not watched either).
static int resolve_watched(int dirfd, const char* path, char* out, size_t out_len) {
  if (!path) return -1;
  char base[PATH_MAX] = "/";
  if (path[0] != '/') {
    if (dirfd == AT_FDCWD) {
      if (!getcwd(base, sizeof base)) return -1;
    } else {
      char link[32];
      snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
      ssize_t n = readlink(link, base, sizeof base - 1);
      if (n <= 0) return -1;
      base[n] = '\0';
    }
  }
  if (iofault_absolute(base, path, out, out_len) != 0) return -1;
  return strncmp(out, spec.prefix, strlen(spec.prefix)) == 0 ? 0 : 1;
}

static void sleep_ms(long ms) {
  struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
}

// Counts one watched call and says what to do with it: 0 perform it, an errno to fail
// with, or (err=short) 0 with *bytes halved. `what` names the file for the message; when
// NULL, the name is read from /proc for `fd`, only if the call misbehaves.
static int decide(int op, const char* what, int fd, size_t* bytes) {
  unsigned long n = atomic_fetch_add(&calls[op], 1) + 1;
  if (op != spec.op || n < spec.nth || (spec.count && n - spec.nth >= spec.count)) return 0;
  int saved_errno = errno;
  char line[2 * PATH_MAX + 128], name[24], fd_path[PATH_MAX];
  if (!what) {
    char link[32];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, fd_path, sizeof fd_path - 1);
    if (len < 0) len = snprintf(fd_path, sizeof fd_path, "fd %d", fd);
    fd_path[len] = '\0';
    what = fd_path;
  }
  if (spec.stall_ms > 0) {
    int len = snprintf(line, sizeof line, "troupe-iofault: stalling %s #%lu on %s for %ld ms\n", iofault_op_name(op), n,
                       what, spec.stall_ms);
    say(line, len < (int)sizeof line ? (size_t)len : sizeof line - 1);
    sleep_ms(spec.stall_ms);
  }
  int err = spec.err;
  if (err) {
    char detail[64] = "";
    if (err == IOFAULT_SHORT && bytes) {
      snprintf(detail, sizeof detail, " (%zu of %zu bytes)", *bytes / 2, *bytes);
      *bytes /= 2;  // half, so always at least one byte less than asked
    }
    int len = snprintf(line, sizeof line, "troupe-iofault: failing %s #%lu on %s: %s%s\n", iofault_op_name(op), n, what,
                       iofault_err_name(err, name), detail);
    say(line, len < (int)sizeof line ? (size_t)len : sizeof line - 1);
  }
  errno = saved_errno;
  return err == IOFAULT_SHORT ? 0 : err;
}

int iofault_on_path(int op, int dirfd, const char* path, int* watched) {
  char absolute[PATH_MAX];
  *watched = active() && resolve_watched(dirfd, path, absolute, sizeof absolute) == 0;
  return *watched ? decide(op, absolute, -1, NULL) : 0;
}

int iofault_on_rename(int old_dirfd, const char* old_path, int new_dirfd, const char* new_path) {
  if (!active()) return 0;
  char from[PATH_MAX], to[PATH_MAX], what[2 * PATH_MAX + 8];
  int from_found = resolve_watched(old_dirfd, old_path, from, sizeof from);
  int to_found = resolve_watched(new_dirfd, new_path, to, sizeof to);
  if (from_found != 0 && to_found != 0) return 0;
  snprintf(what, sizeof what, "%s -> %s", from_found < 0 ? old_path : from, to_found < 0 ? new_path : to);
  return decide(IOFAULT_RENAME, what, -1, NULL);
}

int iofault_on_fd(int op, int fd, size_t* bytes) {
  return iofault_fd_watched(fd) && !in_shim ? decide(op, NULL, fd, bytes) : 0;
}

// TROUPE_IOFAULT_COUNTS: one line per process, appended in a single write(2) so lines of
// processes exiting together do not interleave.
__attribute__((destructor)) static void write_counts(void) {
  if (!spec.active || !spec.counts_path[0]) return;
  char line[256];
  int n = snprintf(line, sizeof line, "open=%lu read=%lu write=%lu fsync=%lu rename=%lu unlink=%lu pid=%ld\n",
                   atomic_load(&calls[IOFAULT_OPEN]), atomic_load(&calls[IOFAULT_READ]),
                   atomic_load(&calls[IOFAULT_WRITE]), atomic_load(&calls[IOFAULT_FSYNC]),
                   atomic_load(&calls[IOFAULT_RENAME]), atomic_load(&calls[IOFAULT_UNLINK]), (long)getpid());
  long fd = syscall(SYS_openat, AT_FDCWD, spec.counts_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    char error[PATH_MAX + 96];
    int len = snprintf(error, sizeof error, "troupe-iofault: cannot append counts to %s: %s\n", spec.counts_path,
                       strerror(errno));
    say(error, len < (int)sizeof error ? (size_t)len : sizeof error - 1);
    return;
  }
  syscall(SYS_write, fd, line, (size_t)n);
  syscall(SYS_close, fd);
}
