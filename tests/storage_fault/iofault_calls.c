// The libc calls libtroupe_iofault.so replaces (glibc 2.36, x86_64), grouped by the kind
// they count as. Each asks the core (iofault.c) whether this call misbehaves, then
// forwards to libc's own definition. The 64-bit twins (open64, pread64, ...) are the same
// functions on x86_64 but separate symbols, so a program may bind to either.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "iofault_calls.h"
#include "iofault_spec.h"

// Fortified entry points (-D_FORTIFY_SOURCE), declared only by headers we do not include.
int __open_2(const char* path, int flags);
int __open64_2(const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags);
ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen);
ssize_t __pread_chk(int fd, void* buf, size_t n, off_t offset, size_t buflen);
ssize_t __pread64_chk(int fd, void* buf, size_t n, off64_t offset, size_t buflen);

// libc's definition of `name`, resolved on first use.
#define REAL(name)                  \
  static void* _Atomic real_##name; \
  __typeof__(&name) real = (__typeof__(&name))iofault_real(#name, &real_##name)

#define FAIL(err, value) return (errno = (err), (value))

// ---- open: the open family, creat and fopen; each marks the descriptor it returns ----

// A mode argument exists only with O_CREAT or O_TMPFILE; reading it otherwise would read
// whatever the caller left in that register.
#define MODE_ARG(flags, last)                                \
  mode_t mode = 0;                                           \
  if ((flags)&O_CREAT || ((flags)&O_TMPFILE) == O_TMPFILE) { \
    va_list ap;                                              \
    va_start(ap, last);                                      \
    mode = va_arg(ap, mode_t);                               \
    va_end(ap);                                              \
  }

// Every open-family call is openat(2) underneath: open(p) is openat(AT_FDCWD, p),
// creat is O_CREAT|O_WRONLY|O_TRUNC, and O_LARGEFILE is implied on x86_64. So all go
// to libc's openat, which keeps its cancellation point and errno handling.
static int open_at(int dirfd, const char* path, int flags, mode_t mode) {
  int watched;
  int err = iofault_on_path(IOFAULT_OPEN, dirfd, path, &watched);
  if (err) FAIL(err, -1);
  REAL(openat);
  int fd = real ? real(dirfd, path, flags, mode) : (int)syscall(SYS_openat, dirfd, path, flags, mode);
  iofault_mark_fd(fd, watched);
  return fd;
}

int open(const char* path, int flags, ...) {
  MODE_ARG(flags, flags);
  return open_at(AT_FDCWD, path, flags, mode);
}
int open64(const char* path, int flags, ...) {
  MODE_ARG(flags, flags);
  return open_at(AT_FDCWD, path, flags, mode);
}
int openat(int dirfd, const char* path, int flags, ...) {
  MODE_ARG(flags, flags);
  return open_at(dirfd, path, flags, mode);
}
int openat64(int dirfd, const char* path, int flags, ...) {
  MODE_ARG(flags, flags);
  return open_at(dirfd, path, flags, mode);
}
int creat(const char* path, mode_t mode) { return open_at(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
int creat64(const char* path, mode_t mode) { return open_at(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode); }

// The fortified forms exist to abort on O_CREAT without a mode; keep that check.
static int open_checked(int dirfd, const char* path, int flags) {
  if (flags & O_CREAT || (flags & O_TMPFILE) == O_TMPFILE) {
    static const char line[] = "troupe-iofault: invalid open call: O_CREAT or O_TMPFILE without mode\n";
    syscall(SYS_write, 2, line, sizeof line - 1);
    abort();
  }
  return open_at(dirfd, path, flags, 0);
}
int __open_2(const char* path, int flags) { return open_checked(AT_FDCWD, path, flags); }
int __open64_2(const char* path, int flags) { return open_checked(AT_FDCWD, path, flags); }
int __openat_2(int dirfd, const char* path, int flags) { return open_checked(dirfd, path, flags); }
int __openat64_2(int dirfd, const char* path, int flags) { return open_checked(dirfd, path, flags); }

// fopen opens inside glibc, out of our reach: count the fopen itself and mark its fd.
static FILE* fopen_with(FILE* (*real)(const char*, const char*), const char* path, const char* mode) {
  int watched;
  int err = iofault_on_path(IOFAULT_OPEN, AT_FDCWD, path, &watched);
  if (err) FAIL(err, NULL);
  if (!real) FAIL(ENOSYS, NULL);
  FILE* file = real(path, mode);
  if (file) iofault_mark_fd(fileno(file), watched);
  return file;
}
FILE* fopen(const char* path, const char* mode) {
  REAL(fopen);
  return fopen_with(real, path, mode);
}
FILE* fopen64(const char* path, const char* mode) {
  REAL(fopen64);
  return fopen_with(real, path, mode);
}

// ---- read and write: by descriptor; err=short halves the byte count ----

ssize_t read(int fd, void* buf, size_t n) {
  int err = iofault_on_fd(IOFAULT_READ, fd, &n);
  if (err) FAIL(err, -1);
  REAL(read);
  return real ? real(fd, buf, n) : syscall(SYS_read, fd, buf, n);
}
ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen) {
  int err = iofault_on_fd(IOFAULT_READ, fd, &n);
  if (err) FAIL(err, -1);
  REAL(__read_chk);
  return real ? real(fd, buf, n, buflen) : syscall(SYS_read, fd, buf, n);
}
ssize_t write(int fd, const void* buf, size_t n) {
  int err = iofault_on_fd(IOFAULT_WRITE, fd, &n);
  if (err) FAIL(err, -1);
  REAL(write);
  return real ? real(fd, buf, n) : syscall(SYS_write, fd, buf, n);
}

ssize_t pread(int fd, void* buf, size_t n, off_t offset) {
  int err = iofault_on_fd(IOFAULT_READ, fd, &n);
  if (err) FAIL(err, -1);
  REAL(pread);
  return real ? real(fd, buf, n, offset) : syscall(SYS_pread64, fd, buf, n, offset);
}
ssize_t pread64(int fd, void* buf, size_t n, off64_t offset) {
  int err = iofault_on_fd(IOFAULT_READ, fd, &n);
  if (err) FAIL(err, -1);
  REAL(pread64);
  return real ? real(fd, buf, n, offset) : syscall(SYS_pread64, fd, buf, n, offset);
}
ssize_t __pread_chk(int fd, void* buf, size_t n, off_t offset, size_t buflen) {
  int err = iofault_on_fd(IOFAULT_READ, fd, &n);
  if (err) FAIL(err, -1);
  REAL(__pread_chk);
  return real ? real(fd, buf, n, offset, buflen) : syscall(SYS_pread64, fd, buf, n, offset);
}
ssize_t __pread64_chk(int fd, void* buf, size_t n, off64_t offset, size_t buflen) {
  int err = iofault_on_fd(IOFAULT_READ, fd, &n);
  if (err) FAIL(err, -1);
  REAL(__pread64_chk);
  return real ? real(fd, buf, n, offset, buflen) : syscall(SYS_pread64, fd, buf, n, offset);
}
ssize_t pwrite(int fd, const void* buf, size_t n, off_t offset) {
  int err = iofault_on_fd(IOFAULT_WRITE, fd, &n);
  if (err) FAIL(err, -1);
  REAL(pwrite);
  return real ? real(fd, buf, n, offset) : syscall(SYS_pwrite64, fd, buf, n, offset);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t offset) {
  int err = iofault_on_fd(IOFAULT_WRITE, fd, &n);
  if (err) FAIL(err, -1);
  REAL(pwrite64);
  return real ? real(fd, buf, n, offset) : syscall(SYS_pwrite64, fd, buf, n, offset);
}

// The vector calls: a short transfer keeps the leading buffers that hold half the bytes.
// `cut` is the caller's; IOV_MAX entries is all a valid call can have.
static int cut_iov(const struct iovec* iov, int count, size_t keep, struct iovec* cut) {
  int kept = 0;
  for (; kept < count && kept < IOV_MAX && keep > 0; ++kept) {
    cut[kept] = iov[kept];
    if (cut[kept].iov_len > keep) cut[kept].iov_len = keep;
    keep -= cut[kept].iov_len;
  }
  return kept;
}

// Counts a vector call on fd; 0 and *count/*iov unchanged to perform it as asked, an
// errno to fail it, or 0 with *iov/*count pointing at `cut` for err=short.
static int on_vector(int op, int fd, const struct iovec** iov, int* count, struct iovec* cut) {
  if (!iofault_fd_watched(fd)) return 0;
  size_t total = 0;
  for (int i = 0; i < *count; ++i) total += (*iov)[i].iov_len;
  size_t asked = total;
  int err = iofault_on_fd(op, fd, &total);
  if (!err && total != asked) {
    *count = cut_iov(*iov, *count, total, cut);
    *iov = cut;
  }
  return err;
}

ssize_t readv(int fd, const struct iovec* iov, int count) {
  struct iovec cut[IOV_MAX];
  int err = on_vector(IOFAULT_READ, fd, &iov, &count, cut);
  if (err) FAIL(err, -1);
  REAL(readv);
  return real ? real(fd, iov, count) : syscall(SYS_readv, fd, iov, count);
}
ssize_t writev(int fd, const struct iovec* iov, int count) {
  struct iovec cut[IOV_MAX];
  int err = on_vector(IOFAULT_WRITE, fd, &iov, &count, cut);
  if (err) FAIL(err, -1);
  REAL(writev);
  return real ? real(fd, iov, count) : syscall(SYS_writev, fd, iov, count);
}
// The raw preadv/pwritev syscalls split the offset in two; without libc, refuse instead.
#define POSITIONED_VECTOR(name, op)                                        \
  ssize_t name(int fd, const struct iovec* iov, int count, off_t offset) { \
    struct iovec cut[IOV_MAX];                                             \
    int err = on_vector(op, fd, &iov, &count, cut);                        \
    if (err) FAIL(err, -1);                                                \
    REAL(name);                                                            \
    return real ? real(fd, iov, count, offset) : (errno = ENOSYS, -1);     \
  }
POSITIONED_VECTOR(preadv, IOFAULT_READ)
POSITIONED_VECTOR(preadv64, IOFAULT_READ)
POSITIONED_VECTOR(pwritev, IOFAULT_WRITE)
POSITIONED_VECTOR(pwritev64, IOFAULT_WRITE)

// ---- fsync ----

int fsync(int fd) {
  int err = iofault_on_fd(IOFAULT_FSYNC, fd, NULL);
  if (err) FAIL(err, -1);
  REAL(fsync);
  return real ? real(fd) : (int)syscall(SYS_fsync, fd);
}
int fdatasync(int fd) {
  int err = iofault_on_fd(IOFAULT_FSYNC, fd, NULL);
  if (err) FAIL(err, -1);
  REAL(fdatasync);
  return real ? real(fd) : (int)syscall(SYS_fdatasync, fd);
}

// ---- rename: watched when either name is ----

int rename(const char* from, const char* to) {
  int err = iofault_on_rename(AT_FDCWD, from, AT_FDCWD, to);
  if (err) FAIL(err, -1);
  REAL(rename);
  return real ? real(from, to) : (errno = ENOSYS, -1);
}
int renameat(int from_dir, const char* from, int to_dir, const char* to) {
  int err = iofault_on_rename(from_dir, from, to_dir, to);
  if (err) FAIL(err, -1);
  REAL(renameat);
  return real ? real(from_dir, from, to_dir, to) : (errno = ENOSYS, -1);
}
int renameat2(int from_dir, const char* from, int to_dir, const char* to, unsigned flags) {
  int err = iofault_on_rename(from_dir, from, to_dir, to);
  if (err) FAIL(err, -1);
  REAL(renameat2);
  return real ? real(from_dir, from, to_dir, to, flags) : (errno = ENOSYS, -1);
}

// ---- unlink: every call that removes a name. std::filesystem::remove calls remove(3),
// whose own unlink/rmdir happen inside glibc, so remove is counted once here. ----

static int on_unlink(int dirfd, const char* path) {
  int watched;
  return iofault_on_path(IOFAULT_UNLINK, dirfd, path, &watched);
}
int unlink(const char* path) {
  int err = on_unlink(AT_FDCWD, path);
  if (err) FAIL(err, -1);
  REAL(unlink);
  return real ? real(path) : (errno = ENOSYS, -1);
}
int unlinkat(int dirfd, const char* path, int flags) {
  int err = on_unlink(dirfd, path);
  if (err) FAIL(err, -1);
  REAL(unlinkat);
  return real ? real(dirfd, path, flags) : (errno = ENOSYS, -1);
}
int rmdir(const char* path) {
  int err = on_unlink(AT_FDCWD, path);
  if (err) FAIL(err, -1);
  REAL(rmdir);
  return real ? real(path) : (errno = ENOSYS, -1);
}
int remove(const char* path) {
  int err = on_unlink(AT_FDCWD, path);
  if (err) FAIL(err, -1);
  REAL(remove);
  return real ? real(path) : (errno = ENOSYS, -1);
}

// ---- the fd table: close forgets, dup copies. A mark is cleared before the close, since
// once closed the number may be reused at once by another thread's open. ----

int close(int fd) {
  iofault_mark_fd(fd, 0);
  REAL(close);
  return real ? real(fd) : (int)syscall(SYS_close, fd);
}
int fclose(FILE* file) {
  if (file) iofault_mark_fd(fileno(file), 0);
  REAL(fclose);
  return real ? real(file) : (errno = ENOSYS, EOF);
}
int close_range(unsigned first, unsigned last, int flags) {
  if (!(flags & CLOSE_RANGE_CLOEXEC)) iofault_clear_fds(first, last);
  REAL(close_range);
  return real ? real(first, last, flags) : (int)syscall(SYS_close_range, first, last, flags);
}
void closefrom(int lowest) {
  if (lowest >= 0) iofault_clear_fds((unsigned)lowest, UINT_MAX);
  REAL(closefrom);
  if (real)
    real(lowest);
  else
    syscall(SYS_close_range, lowest, ~0U, 0);
}

int dup(int fd) {
  REAL(dup);
  int copy = real ? real(fd) : (int)syscall(SYS_dup, fd);
  iofault_mark_fd(copy, iofault_fd_watched(fd));
  return copy;
}
int dup2(int fd, int target) {
  REAL(dup2);
  int copy = real ? real(fd, target) : (int)syscall(SYS_dup2, fd, target);
  if (copy >= 0 && copy != fd) iofault_mark_fd(copy, iofault_fd_watched(fd));
  return copy;
}
int dup3(int fd, int target, int flags) {
  REAL(dup3);
  int copy = real ? real(fd, target, flags) : (int)syscall(SYS_dup3, fd, target, flags);
  if (copy >= 0) iofault_mark_fd(copy, iofault_fd_watched(fd));
  return copy;
}

// fcntl's third argument is an int, a pointer or absent; glibc itself reads it as a
// void * and passes it on, which is exact for all three on x86_64.
static int fcntl_with(int (*real)(int, int, ...), int fd, int command, void* arg) {
  int result = real ? real(fd, command, arg) : (int)syscall(SYS_fcntl, fd, command, arg);
  if ((command == F_DUPFD || command == F_DUPFD_CLOEXEC) && result >= 0)
    iofault_mark_fd(result, iofault_fd_watched(fd));
  return result;
}
int fcntl(int fd, int command, ...) {
  va_list ap;
  va_start(ap, command);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  REAL(fcntl);
  return fcntl_with(real, fd, command, arg);
}
int fcntl64(int fd, int command, ...) {
  va_list ap;
  va_start(ap, command);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  REAL(fcntl64);
  return fcntl_with(real, fd, command, arg);
}
