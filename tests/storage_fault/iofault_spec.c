// Reading TROUPE_IOFAULT (iofault_spec.h). Strict on purpose: a test whose fault was
// misspelt must not pass by running without it, so every unknown key, bad number or
// combination that would inject nothing is an error the shim aborts on.
#define _GNU_SOURCE
#include "iofault_spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char* const op_names[IOFAULT_OPS] = {"open", "read", "write", "fsync", "rename", "unlink"};

// The errors a test may ask for: the storage failures a checkpoint writer meets (a full
// or read-only disk, quota, an NFS handle gone stale, a transient EAGAIN or EINTR, out of
// descriptors) plus the few a rename or open can return on its own.
static const struct {
  const char* name;
  int value;
} errors[] = {
    {"EIO", EIO},       {"ENOSPC", ENOSPC}, {"EACCES", EACCES}, {"ESTALE", ESTALE},
    {"EAGAIN", EAGAIN}, {"EMFILE", EMFILE}, {"EROFS", EROFS},   {"EDQUOT", EDQUOT},
    {"EINTR", EINTR},   {"ENOENT", ENOENT}, {"EPERM", EPERM},   {"EXDEV", EXDEV},
};

const char* iofault_op_name(int op) { return op >= 0 && op < IOFAULT_OPS ? op_names[op] : "none"; }

const char* iofault_err_name(int err, char* buf) {
  if (err == IOFAULT_SHORT) return "short";
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; ++i)
    if (errors[i].value == err) return errors[i].name;
  snprintf(buf, 24, "errno %d", err);
  return buf;
}

int iofault_absolute(const char* base, const char* path, char* out, size_t out_len) {
  char joined[2 * PATH_MAX];
  int n = path[0] == '/' ? snprintf(joined, sizeof joined, "%s", path)
                         : snprintf(joined, sizeof joined, "%s/%s", base, path);
  if (n < 0 || (size_t)n >= sizeof joined) return -1;
  // Rebuild component by component: "." and "" vanish, ".." drops the last one.
  size_t len = 0;
  for (char* part = joined; *part;) {
    while (*part == '/') ++part;
    size_t part_len = strcspn(part, "/");
    if (part_len == 0 || (part_len == 1 && part[0] == '.')) {
      // nothing to add
    } else if (part_len == 2 && part[0] == '.' && part[1] == '.') {
      while (len > 0 && out[len - 1] != '/') --len;
      if (len > 0) --len;  // the '/' before the dropped component
    } else {
      if (len + 1 + part_len + 1 > out_len) return -1;
      out[len++] = '/';
      memcpy(out + len, part, part_len);
      len += part_len;
    }
    part += part_len;
  }
  if (len == 0) out[len++] = '/';
  // "starts with PREFIX" is textual: "/ckpt/" must not match "/ckpt2", so keep the '/'.
  size_t path_len = strlen(path);
  if (path_len > 0 && path[path_len - 1] == '/' && out[len - 1] != '/') {
    if (len + 2 > out_len) return -1;
    out[len++] = '/';
  }
  out[len] = '\0';
  return 0;
}

static int fail(char* why, size_t why_len, const char* format, const char* value) {
  snprintf(why, why_len, format, value);
  return -1;
}

static int parse_number(const char* value, unsigned long min, unsigned long max, unsigned long* out) {
  char* end;
  errno = 0;
  unsigned long n = strtoul(value, &end, 10);
  if (errno || end == value || *end || value[0] == '-' || n < min || n > max) return -1;
  *out = n;
  return 0;
}

// One key=value pair of TROUPE_IOFAULT into *out; `seen` flags repeated keys.
static int parse_pair(char* pair, struct iofault_spec* out, unsigned* seen, char* why, size_t why_len) {
  static const char* const keys[] = {"path", "op", "nth", "count", "err", "stall_ms"};
  char* value = strchr(pair, '=');
  if (!value) return fail(why, why_len, "'%s' is not key=value", pair);
  *value++ = '\0';
  unsigned key = 0;
  while (key < 6 && strcmp(pair, keys[key]) != 0) ++key;
  if (key == 6) return fail(why, why_len, "unknown key '%s' (path, op, nth, count, err, stall_ms)", pair);
  if (*seen & (1u << key)) return fail(why, why_len, "'%s' given twice", pair);
  *seen |= 1u << key;
  unsigned long n;
  switch (key) {
    case 0: {
      char cwd[PATH_MAX];
      if (!*value) return fail(why, why_len, "empty path%s", "");
      if (value[0] != '/' && !getcwd(cwd, sizeof cwd)) return fail(why, why_len, "getcwd failed for '%s'", value);
      if (iofault_absolute(cwd, value, out->prefix, sizeof out->prefix) != 0)
        return fail(why, why_len, "path '%s' is too long", value);
      return 0;
    }
    case 1:
      for (int op = 0; op < IOFAULT_OPS; ++op)
        if (strcmp(value, op_names[op]) == 0) return out->op = op, 0;
      return fail(why, why_len, "unknown op '%s' (open, read, write, fsync, rename, unlink)", value);
    case 2:
      if (parse_number(value, 1, ULONG_MAX / 2, &out->nth))
        return fail(why, why_len, "nth '%s' is not a number >= 1", value);
      return 0;
    case 3:
      if (parse_number(value, 0, ULONG_MAX / 2, &out->count))
        return fail(why, why_len, "count '%s' is not a number >= 0", value);
      return 0;
    case 4:
      if (strcmp(value, "short") == 0) return out->err = IOFAULT_SHORT, 0;
      for (size_t i = 0; i < sizeof errors / sizeof errors[0]; ++i)
        if (strcmp(value, errors[i].name) == 0) return out->err = errors[i].value, 0;
      return fail(why, why_len,
                  "unknown err '%s' (EIO, ENOSPC, EACCES, ESTALE, EAGAIN, EMFILE, EROFS, EDQUOT, "
                  "EINTR, ENOENT, EPERM, EXDEV, short)",
                  value);
    default:
      if (parse_number(value, 0, 3600 * 1000, &n)) return fail(why, why_len, "stall_ms '%s' is not 0..3600000", value);
      out->stall_ms = (long)n;
      return 0;
  }
}

int iofault_parse(const char* text, const char* counts, struct iofault_spec* out, char* why, size_t why_len) {
  memset(out, 0, sizeof *out);
  out->op = -1;
  out->count = 1;
  if (!text && !counts) return 0;  // loaded but told nothing: forward every call
  if (!text) return fail(why, why_len, "TROUPE_IOFAULT_COUNTS needs TROUPE_IOFAULT=path=PREFIX%s", "");
  char copy[2 * PATH_MAX];
  if (strlen(text) >= sizeof copy) return fail(why, why_len, "TROUPE_IOFAULT is too long%s", "");
  strcpy(copy, text);
  unsigned seen = 0;
  for (char *save = NULL, *pair = strtok_r(copy, ",", &save); pair; pair = strtok_r(NULL, ",", &save))
    if (parse_pair(pair, out, &seen, why, why_len) != 0) return -1;
  const unsigned path = 1, op = 2, nth = 4, err = 16, stall = 32;
  if (!(seen & path)) return fail(why, why_len, "path=PREFIX is required%s", "");
  if ((seen & ~(path | op)) && !(seen & op))
    return fail(why, why_len, "nth, count, err and stall_ms need op=KIND%s", "");
  if ((seen & op) && !(seen & nth)) return fail(why, why_len, "op=%s needs nth=N", op_names[out->op]);
  if ((seen & op) && !(seen & err) && !(seen & stall && out->stall_ms > 0))
    return fail(why, why_len, "op=%s needs err=NAME or stall_ms=M > 0, or it injects nothing", op_names[out->op]);
  if (out->err == IOFAULT_SHORT && out->op != IOFAULT_READ && out->op != IOFAULT_WRITE)
    return fail(why, why_len, "err=short is for op=read or op=write, not op=%s", op_names[out->op]);
  if (counts) {
    if (!*counts || strlen(counts) >= sizeof out->counts_path)
      return fail(why, why_len, "TROUPE_IOFAULT_COUNTS '%s' is empty or too long", counts);
    strcpy(out->counts_path, counts);
  }
  out->active = 1;
  return 0;
}
