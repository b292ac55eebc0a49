/*
 * Bulk I/O on the worker pool: one connection's large write (the iovecs of
 * a pull: frame prefixes and pointers into tensors) or large read
 * (straight into a recv target) runs on a pool thread while the loop
 * thread goes on with everything else.  See docs/internals/engine.md,
 * "Bulk I/O on the worker pool".
 *
 * The loop thread owns an hr__bulk between jobs; while a job is out the
 * worker owns the descriptor's direction and the memory, and the loop
 * only reads `state` under the lock (hr__bulk_stop).  The worker moves
 * bytes with non-blocking calls and poll(), so that a write to the
 * job's abort eventfd wakes it at once; it gives up on its own after
 * HR__BULK_STALL_NS without finishing (a slow peer must not hold a pool
 * thread), leaving the rest to the loop, and at once when other jobs
 * wait for a thread (the loop then waits for readiness itself, so that a
 * few threads serve many connections without blocking on one).
 */
#ifndef HR_BULK_H
#define HR_BULK_H

#include <pthread.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <hurray/engine.h>

#include "hr_pool.h"

#define HR__BULK_IOV 128
#define HR__BULK_STALL_NS (200ull * 1000000ull)
#define HR__BULK_NAP_MS 5

enum { HR__BULK_IDLE, HR__BULK_QUEUED, HR__BULK_RUNNING, HR__BULK_FINISHED };

typedef struct hr__bulk {
  hr__job base; /* first: the pool hands back hr__job pointers */
  void *owner;  /* the connection */
  hr__pool *pool; /* where it runs: a job that would wait yields to queued
                     ones */
  int dir;      /* HR_IO_TX or HR_IO_RX */
  int fd;       /* the socket (not owned) */
  int abort_fd; /* eventfd that wakes the worker (owned) */
  struct iovec iov[HR__BULK_IOV]; /* TX: what to write; RX: iov[0] */
  int niov;
  size_t total;
  /* Results: written by the worker, read by the loop once the job is
   * back (or stopped). */
  size_t done; /* bytes moved */
  int err;     /* errno of the call that failed, or 0 */
  int eof;     /* RX: the peer closed its side */
  int stalled; /* gave up after HR__BULK_STALL_NS */
  int fenced;  /* loop only: the session counted the bytes (io_fence) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state; /* HR__BULK_*, under mu */
  int abort; /* under mu, and read atomically by the worker */
} hr__bulk;

/* Prepares `b` (its lock and abort eventfd) for jobs of `owner` on
 * `pool`.  Returns 0 or HR_ERR_IO. */
int hr__bulk_init(hr__bulk *b, void *owner, hr__pool *pool);
/* Frees what init made; the job must not be out. */
void hr__bulk_fini(hr__bulk *b);
/* Readies a job of `dir` on `fd` for the pool (the caller filled iov,
 * niov and total). */
void hr__bulk_arm(hr__bulk *b, int dir, int fd);
/* Whether `j` is a bulk job (and not a work item's). */
int hr__bulk_is(const hr__job *j);
/* Loop thread: stops the job and waits until the worker no longer touches
 * the descriptor or the memory (a job not started yet never will).  The
 * job still comes back through the pool's completion list.  Idempotent. */
void hr__bulk_stop(hr__bulk *b);

/* ---- How many jobs at once (hr_engine_config.bulk_offload_jobs) ---- */

/* The most bulk jobs an engine may have out at once for a connection.
 * `setting` is hr_engine_config.bulk_offload_jobs (> 0: that many,
 * whatever the machine; 0: automatic), `cpus` the CPUs this process may
 * run on (hr__bulk_cpus), `same_host` whether the peer's threads run on
 * those CPUs too.  Automatic: the loop thread moves bytes as well and
 * keeps one CPU, so one job less than the CPUs this end has; a peer on
 * the same host needs half of them for its own end.  0 means never:
 * with one CPU per end, a job only adds handoffs and contention (on
 * 2 cores, server and client of one host: every lane on the loops). */
unsigned hr__bulk_jobs_max(int setting, long cpus, int same_host);
/* Whether the socket addresses `local` and `peer` (of one connection)
 * are on one host: a Unix socket, a loopback peer (127/8, ::1, IPv4
 * mapped loopback), or a peer whose address is our own.  Unknown
 * families and NULL: 0. */
int hr__bulk_same_host(const struct sockaddr *local,
                       const struct sockaddr *peer);
/* hr__bulk_same_host() of a connected socket (0 when either address
 * cannot be read). */
int hr__bulk_fd_same_host(int fd);
/* The CPUs this process may use (hr_cpus.c): the CPUs of its affinity
 * mask (the online CPUs when the mask cannot be read), capped by
 * ceil(quota / period) of its cgroup's CPU quota (hr__cgroup_cpu_quota);
 * at least 1.  Reads /proc and /sys each call: an engine calls it once,
 * in hr_engine_new() (the blocking client once per connect, passing the
 * count to hr__engine_new_cpus()). */
long hr__bulk_cpus(void);
/* The same with every file read under `root` (a directory standing for
 * "/", for tests; NULL: the real files). */
long hr__bulk_cpus_at(const char *root);
/* hr_engine_new() with `cpus` (hr__bulk_cpus(), read by the caller) as
 * the CPUs this process may use, so that a caller which sized its own
 * settings by them (the blocking client) reads the files once. */
int hr__engine_new_cpus(hr_engine **out, const hr_loop_ops *ops,
                        void *loop_data, const hr_engine_config *cfg,
                        const hr_mem *mem, long cpus);
/* The CPU quota of this process's cgroup, in CPUs rounded up: the
 * tightest of the limits from its cgroup (named by root/proc/self/cgroup)
 * up to the hierarchy's root, read from root/sys/fs/cgroup/PATH/cpu.max
 * on cgroup v2 ("QUOTA PERIOD"; "max": none) or, where a v1 hierarchy has
 * the cpu controller, cpu.cfs_quota_us ("-1": none) over
 * cpu.cfs_period_us under root/sys/fs/cgroup/cpu,cpuacct (or .../cpu).
 * 0 when there is no limit, or nothing readable and well-formed says one
 * (missing files, garbage, a zero period). */
long hr__cgroup_cpu_quota(const char *root);

#endif /* HR_BULK_H */
