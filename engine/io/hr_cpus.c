/*
 * How many CPUs this process may use: its affinity mask, capped by the
 * CPU quota of its cgroup (hr__bulk_cpus, decision 51).
 *
 * In a container the quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us over
 * cpu.cfs_period_us) is often far below the CPUs the affinity mask shows
 * (all of the host's): sizing the bulk jobs by the mask would start more
 * byte-moving threads than the container may run at once, which the
 * kernel then throttles in 100 ms steps.  So the CPUs are the smaller of
 * the mask and ceil(quota / period).
 *
 * The files are read once per engine (hr_engine_new; the blocking
 * client once per connect, for its pool and its engine), never cached in
 * a global.  Every path goes under `root` ("/" in production, a directory
 * of fake files in the tests).  Anything missing, unreadable or malformed
 * means "no limit from there": the quota can only lower the count.
 */
#include "hr_bulk.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Deepest cgroup nesting walked (a guard; real trees are a few levels). */
#define CG_MAX_DEPTH 64

/* Reads up to cap - 1 bytes of root/path into buf (NUL-terminated).
 * Returns the bytes read, or -1. */
static ssize_t read_small(const char *root, const char *path, char *buf,
                          size_t cap) {
  char full[PATH_MAX];
  int n = snprintf(full, sizeof full, "%s%s", root, path);
  if (n < 0 || (size_t)n >= sizeof full)
    return -1;
  int fd = open(full, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  size_t got = 0;
  while (got < cap - 1) {
    ssize_t r = read(fd, buf + got, cap - 1 - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    got += (size_t)r;
  }
  close(fd);
  buf[got] = '\0';
  return (ssize_t)got;
}

/* Parses a positive decimal at *p (skipping leading blanks), moving *p
 * past it; 0 when there is none or it overflows. */
static uint64_t parse_pos(const char **p) {
  const char *s = *p;
  while (*s == ' ' || *s == '\t')
    s++;
  if (*s < '0' || *s > '9')
    return 0;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    if (v > (UINT64_MAX - 9) / 10)
      return 0;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *p = s;
  return v;
}

/* Whether only blanks and line ends are left at s. */
static int at_end(const char *s) {
  while (*s == ' ' || *s == '\t' || *s == '\n')
    s++;
  return *s == '\0';
}

static long ceil_div(uint64_t quota, uint64_t period) {
  uint64_t c = quota / period + (quota % period != 0);
  return c > LONG_MAX ? LONG_MAX : (long)c;
}

/* v2: "max PERIOD" (no limit) or "QUOTA PERIOD".  0: no limit here. */
static long v2_limit(const char *root, const char *dir) {
  char path[PATH_MAX], buf[128];
  int n = snprintf(path, sizeof path, "%s/cpu.max", dir);
  if (n < 0 || (size_t)n >= sizeof path ||
      read_small(root, path, buf, sizeof buf) <= 0)
    return 0;
  const char *p = buf;
  uint64_t quota = parse_pos(&p);
  if (!quota || (*p != ' ' && *p != '\t'))
    return 0; /* "max", or malformed */
  uint64_t period = parse_pos(&p);
  if (!period || !at_end(p))
    return 0;
  return ceil_div(quota, period);
}

/* v1: cpu.cfs_quota_us ("-1": no limit) over cpu.cfs_period_us. */
static long v1_limit(const char *root, const char *dir) {
  char path[PATH_MAX], buf[64];
  int n = snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
  if (n < 0 || (size_t)n >= sizeof path ||
      read_small(root, path, buf, sizeof buf) <= 0)
    return 0;
  const char *p = buf;
  uint64_t quota = parse_pos(&p);
  if (!quota || !at_end(p))
    return 0; /* "-1", or malformed */
  n = snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
  if (n < 0 || (size_t)n >= sizeof path ||
      read_small(root, path, buf, sizeof buf) <= 0)
    return 0;
  p = buf;
  uint64_t period = parse_pos(&p);
  if (!period || !at_end(p))
    return 0;
  return ceil_div(quota, period);
}

/* The tightest limit from cgroup `cg` (a path from /proc/self/cgroup)
 * up to the root of the hierarchy mounted at `mnt`: a quota set on an
 * ancestor binds its descendants too, and in a container whose cgroup
 * namespace is not its own the process's path does not exist under the
 * mount, whose root is then the container's cgroup. */
static long walk_up(const char *root, const char *mnt, const char *cg, int v1) {
  char dir[PATH_MAX];
  int n = snprintf(dir, sizeof dir, "%s%s", mnt, cg);
  if (n < 0 || (size_t)n >= sizeof dir)
    return 0;
  size_t base = strlen(mnt);
  long best = 0;
  for (int depth = 0; depth < CG_MAX_DEPTH; depth++) {
    size_t len = strlen(dir);
    while (len > base && dir[len - 1] == '/')
      dir[--len] = '\0';
    long l = v1 ? v1_limit(root, dir) : v2_limit(root, dir);
    if (l > 0 && (best == 0 || l < best))
      best = l;
    if (len <= base)
      break;
    char *slash = strrchr(dir + base, '/');
    if (!slash)
      break;
    *slash = '\0';
  }
  return best;
}

/* Whether the comma-separated controller list [s, e) names "cpu". */
static int has_cpu(const char *s, const char *e) {
  while (s < e) {
    const char *c = memchr(s, ',', (size_t)(e - s));
    if (!c)
      c = e;
    if (c - s == 3 && memcmp(s, "cpu", 3) == 0)
      return 1;
    s = c + 1;
  }
  return 0;
}

long hr__cgroup_cpu_quota(const char *root) {
  char buf[4096];
  if (!root)
    root = "";
  if (read_small(root, "/proc/self/cgroup", buf, sizeof buf) <= 0)
    return 0;
  char v1path[PATH_MAX] = "", v2path[PATH_MAX] = "";
  int have_v1 = 0, have_v2 = 0;
  for (char *line = buf; *line;) {
    char *end = strchr(line, '\n');
    if (end)
      *end = '\0';
    /* "ID:CONTROLLERS:PATH"; the path may itself hold ':'. */
    char *c1 = strchr(line, ':');
    char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (c2 && c2[1] == '/' && strlen(c2 + 1) < PATH_MAX) {
      if (c1 == line + 1 && line[0] == '0' && c2 == c1 + 1) {
        strcpy(v2path, c2 + 1);
        have_v2 = 1;
      } else if (has_cpu(c1 + 1, c2)) {
        strcpy(v1path, c2 + 1);
        have_v1 = 1;
      }
    }
    if (!end)
      break;
    line = end + 1;
  }
  /* A cpu controller on v1 (a hybrid host) is where the quota is. */
  if (have_v1) {
    long l = walk_up(root, "/sys/fs/cgroup/cpu,cpuacct", v1path, 1);
    return l ? l : walk_up(root, "/sys/fs/cgroup/cpu", v1path, 1);
  }
  return have_v2 ? walk_up(root, "/sys/fs/cgroup", v2path, 0) : 0;
}

long hr__bulk_cpus_at(const char *root) {
  cpu_set_t set;
  long n = 0;

  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    n = CPU_COUNT(&set);
  if (n < 1)
    n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1)
    n = 1;
  long q = hr__cgroup_cpu_quota(root);
  return q > 0 && q < n ? q : n;
}

long hr__bulk_cpus(void) {
  return hr__bulk_cpus_at(NULL);
}
