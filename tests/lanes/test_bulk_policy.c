/*
 * How many bulk jobs an engine has out at once (hr__bulk_jobs_max,
 * hr_engine_config.bulk_offload_jobs) and whether a peer shares our CPUs
 * (hr__bulk_same_host): the pure functions, and the socket and CPU
 * readers they are fed with, the cgroup CPU quota (v2 and v1) read from
 * fake files.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/io/hr_bulk.h"

/* Automatic: one job less than this end's CPUs; a same-host peer takes
 * half of them.  A setting wins whatever the machine. */
static void jobs_max(void **state) {
  (void)state;
  /* 2 CPUs, both ends on them: nothing offloaded (the lanes_bench case). */
  assert_int_equal(hr__bulk_jobs_max(0, 2, 1), 0);
  /* 2 CPUs, a remote peer: the loop and one worker. */
  assert_int_equal(hr__bulk_jobs_max(0, 2, 0), 1);
  /* 16 CPUs: 7 jobs for a local peer (4 lanes all offloaded), 15 remote. */
  assert_int_equal(hr__bulk_jobs_max(0, 16, 1), 7);
  assert_int_equal(hr__bulk_jobs_max(0, 16, 0), 15);
  /* Odd counts round this end's share down. */
  assert_int_equal(hr__bulk_jobs_max(0, 3, 1), 0);
  assert_int_equal(hr__bulk_jobs_max(0, 5, 1), 1);
  assert_int_equal(hr__bulk_jobs_max(0, 4, 1), 1);
  /* One CPU, or an unreadable count: never. */
  assert_int_equal(hr__bulk_jobs_max(0, 1, 0), 0);
  assert_int_equal(hr__bulk_jobs_max(0, 1, 1), 0);
  assert_int_equal(hr__bulk_jobs_max(0, 0, 0), 0);
  assert_int_equal(hr__bulk_jobs_max(0, -1, 0), 0);
  /* A setting: exactly that. */
  assert_int_equal(hr__bulk_jobs_max(8, 2, 1), 8);
  assert_int_equal(hr__bulk_jobs_max(1, 64, 0), 1);
  assert_int_equal(hr__bulk_jobs_max(3, 1, 0), 3);
}

static struct sockaddr_in v4(const char *ip) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  assert_int_equal(inet_pton(AF_INET, ip, &a.sin_addr), 1);
  return a;
}

static struct sockaddr_in6 v6(const char *ip) {
  struct sockaddr_in6 a;
  memset(&a, 0, sizeof a);
  a.sin6_family = AF_INET6;
  assert_int_equal(inet_pton(AF_INET6, ip, &a.sin6_addr), 1);
  return a;
}

#define SA(x) ((const struct sockaddr *)&(x))

static void same_host(void **state) {
  (void)state;
  struct sockaddr_in lo = v4("127.0.0.1"), lo2 = v4("127.8.9.1");
  struct sockaddr_in me = v4("10.0.0.5"), other = v4("10.0.0.6");
  struct sockaddr_in mapped_me = v4("192.168.1.2");
  struct sockaddr_in6 lo6 = v6("::1"), me6 = v6("fd00::5");
  struct sockaddr_in6 other6 = v6("fd00::6");
  struct sockaddr_in6 mapped_lo = v6("::ffff:127.0.0.1");
  struct sockaddr_in6 mapped_far = v6("::ffff:192.168.1.2");
  struct sockaddr_un un;

  memset(&un, 0, sizeof un);
  un.sun_family = AF_UNIX;
  /* Loopback peers, whatever our address. */
  assert_true(hr__bulk_same_host(SA(lo), SA(lo)));
  assert_true(hr__bulk_same_host(SA(me), SA(lo2)));
  assert_true(hr__bulk_same_host(SA(me6), SA(lo6)));
  assert_true(hr__bulk_same_host(SA(me6), SA(mapped_lo)));
  /* Our own address on both ends (through the loopback device too). */
  assert_true(hr__bulk_same_host(SA(me), SA(me)));
  assert_true(hr__bulk_same_host(SA(me6), SA(me6)));
  /* Another host. */
  assert_false(hr__bulk_same_host(SA(me), SA(other)));
  assert_false(hr__bulk_same_host(SA(me6), SA(other6)));
  assert_false(hr__bulk_same_host(SA(me6), SA(mapped_far)));
  /* Mixed families compare no addresses. */
  assert_false(hr__bulk_same_host(SA(me6), SA(mapped_me)));
  assert_false(hr__bulk_same_host(SA(mapped_me), SA(mapped_far)));
  /* A Unix socket is always this host. */
  assert_true(hr__bulk_same_host(SA(un), SA(un)));
  /* Nothing known. */
  assert_false(hr__bulk_same_host(NULL, SA(lo)));
  assert_false(hr__bulk_same_host(SA(lo), NULL));
}

/* The socket reader on real descriptors: a loopback TCP pair and a Unix
 * pair are on this host; a descriptor that is no connected socket is
 * not known to be. */
static void fd_same_host(void **state) {
  (void)state;
  struct sockaddr_in a = v4("127.0.0.1");
  socklen_t alen = sizeof a;
  int l = socket(AF_INET, SOCK_STREAM, 0), c, s, sv[2];

  assert_true(l >= 0);
  assert_int_equal(bind(l, SA(a), sizeof a), 0);
  assert_int_equal(listen(l, 1), 0);
  assert_int_equal(getsockname(l, (struct sockaddr *)&a, &alen), 0);
  c = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(c, SA(a), sizeof a), 0);
  s = accept(l, NULL, NULL);
  assert_true(s >= 0);
  assert_true(hr__bulk_fd_same_host(c));
  assert_true(hr__bulk_fd_same_host(s));
  /* A listening socket has no peer. */
  assert_false(hr__bulk_fd_same_host(l));
  assert_false(hr__bulk_fd_same_host(-1));
  close(c);
  close(s);
  close(l);
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  assert_true(hr__bulk_fd_same_host(sv[0]));
  close(sv[0]);
  close(sv[1]);
}

/* A directory standing for "/" with the given files (fake_file: path,
 * contents), removed by fake_free(). */
typedef struct fake {
  char root[64];
} fake;

static void fake_file(fake *f, const char *path, const char *text) {
  char full[512];
  snprintf(full, sizeof full, "%s%s", f->root, path);
  /* The parent directories, one at a time below the root. */
  for (char *p = full + strlen(f->root) + 1; (p = strchr(p, '/')); p++) {
    *p = '\0';
    assert_true(mkdir(full, 0700) == 0 || errno == EEXIST);
    *p = '/';
  }
  FILE *fp = fopen(full, "w");
  assert_non_null(fp);
  assert_int_equal(fputs(text, fp) >= 0, 1);
  assert_int_equal(fclose(fp), 0);
}

static void fake_new(fake *f) {
  strcpy(f->root, "/tmp/hr_cgroup_XXXXXX");
  assert_non_null(mkdtemp(f->root));
}

static int rm_one(const char *path, const struct stat *st, int flag,
                  struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void fake_free(fake *f) {
  assert_int_equal(nftw(f->root, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* cgroup v2: the quota of the process's cgroup or of an ancestor. */
static long v2(const char *self, const char *path, const char *cpu_max) {
  fake f;
  fake_new(&f);
  fake_file(&f, "/proc/self/cgroup", self);
  char p[256];
  snprintf(p, sizeof p, "/sys/fs/cgroup%s/cpu.max", path);
  if (cpu_max)
    fake_file(&f, p, cpu_max);
  long q = hr__cgroup_cpu_quota(f.root);
  fake_free(&f);
  return q;
}

static void cgroup_v2(void **state) {
  (void)state;
  const char *self = "0::/kubepods/pod1/ctr\n";
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "max 100000\n"), 0);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "200000 100000\n"), 2);
  /* Rounded up: 1.5 CPUs of quota keep two threads busy part-time. */
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "150000 100000"), 2);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "50000 100000\n"), 1);
  /* Set on an ancestor (the pod), or at the mount's root (a container
   * whose cgroup path is the host's, its own cgroup mounted as root). */
  assert_int_equal(v2(self, "/kubepods/pod1", "300000 100000\n"), 3);
  assert_int_equal(v2(self, "", "400000 100000\n"), 4);
  /* Malformed or missing: no limit. */
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "garbage\n"), 0);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "200000\n"), 0);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "200000 0\n"), 0);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "-5 100000\n"), 0);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "200000 100000 x\n"), 0);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", ""), 0);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", "99999999999999999999999 1"),
                   0);
  assert_int_equal(v2(self, "/kubepods/pod1/ctr", NULL), 0);
  assert_int_equal(v2("nonsense", "/kubepods/pod1/ctr", "200000 100000"), 0);
  assert_int_equal(v2("", "", "200000 100000"), 0);
  /* The tightest on the way up wins. */
  fake f;
  fake_new(&f);
  fake_file(&f, "/proc/self/cgroup", self);
  fake_file(&f, "/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "800000 100000");
  fake_file(&f, "/sys/fs/cgroup/kubepods/pod1/cpu.max", "300000 100000");
  fake_file(&f, "/sys/fs/cgroup/kubepods/cpu.max", "max 100000");
  assert_int_equal(hr__cgroup_cpu_quota(f.root), 3);
  /* No /proc/self/cgroup at all. */
  fake_free(&f);
  fake_new(&f);
  assert_int_equal(hr__cgroup_cpu_quota(f.root), 0);
  fake_free(&f);
}

static void cgroup_v1(void **state) {
  (void)state;
  fake f;
  fake_new(&f);
  fake_file(&f, "/proc/self/cgroup",
            "12:memory:/docker/abc\n"
            "4:cpu,cpuacct:/docker/abc\n"
            "0::/system.slice/x\n");
  const char *d = "/sys/fs/cgroup/cpu,cpuacct/docker/abc";
  char p[256];
  snprintf(p, sizeof p, "%s/cpu.cfs_quota_us", d);
  fake_file(&f, p, "250000\n");
  snprintf(p, sizeof p, "%s/cpu.cfs_period_us", d);
  fake_file(&f, p, "100000\n");
  /* The v1 cpu controller wins over the v2 line of a hybrid host. */
  fake_file(&f, "/sys/fs/cgroup/system.slice/x/cpu.max", "100000 100000");
  assert_int_equal(hr__cgroup_cpu_quota(f.root), 3);
  snprintf(p, sizeof p, "%s/cpu.cfs_quota_us", d);
  fake_file(&f, p, "-1\n");
  assert_int_equal(hr__cgroup_cpu_quota(f.root), 0);
  fake_file(&f, p, "x\n");
  assert_int_equal(hr__cgroup_cpu_quota(f.root), 0);
  fake_file(&f, p, "100000\n");
  snprintf(p, sizeof p, "%s/cpu.cfs_period_us", d);
  fake_file(&f, p, "0\n");
  assert_int_equal(hr__cgroup_cpu_quota(f.root), 0);
  fake_free(&f);
  /* The controller mounted alone as .../cpu. */
  fake_new(&f);
  fake_file(&f, "/proc/self/cgroup", "3:cpu:/\n");
  fake_file(&f, "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "100000");
  fake_file(&f, "/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000");
  assert_int_equal(hr__cgroup_cpu_quota(f.root), 1);
  fake_free(&f);
}

/* The CPU count follows the affinity mask (what taskset sets), capped by
 * the cgroup's quota. */
static void cpus(void **state) {
  (void)state;
  cpu_set_t set, one;
  fake f;
  fake_new(&f); /* no cgroup files: the mask alone */

  assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
  long mask = CPU_COUNT(&set);
  assert_int_equal(hr__bulk_cpus_at(f.root), mask);
  /* The real files may only lower it. */
  long q = hr__cgroup_cpu_quota(NULL);
  assert_int_equal(hr__bulk_cpus(), q > 0 && q < mask ? q : mask);
  /* A quota of one CPU, below the mask; one above it changes nothing. */
  fake_file(&f, "/proc/self/cgroup", "0::/\n");
  fake_file(&f, "/sys/fs/cgroup/cpu.max", "100000 100000\n");
  assert_int_equal(hr__bulk_cpus_at(f.root), 1);
  fake_file(&f, "/sys/fs/cgroup/cpu.max", "100000000 100000\n");
  assert_int_equal(hr__bulk_cpus_at(f.root), mask);
  fake_free(&f);
  fake_new(&f);
  CPU_ZERO(&one);
  for (int i = 0; i < CPU_SETSIZE; i++)
    if (CPU_ISSET(i, &set)) {
      CPU_SET(i, &one);
      break;
    }
  assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
  assert_int_equal(hr__bulk_cpus_at(f.root), 1);
  assert_int_equal(sched_setaffinity(0, sizeof set, &set), 0);
  fake_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(jobs_max),     cmocka_unit_test(same_host),
      cmocka_unit_test(fd_same_host), cmocka_unit_test(cgroup_v2),
      cmocka_unit_test(cgroup_v1),    cmocka_unit_test(cpus),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
