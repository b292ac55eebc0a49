/*
 * What the loopback benchmarks share (perf/engine_bench.c, tls_bench.c,
 * shm_bench.c, gpu_engine_bench.c, stage_bench.c): clocks, sizes on the
 * command line, medians, a raw TCP listener and connect on 127.0.0.1, a
 * patterned tensor, and a hurray server on its own thread (a libevent
 * loop serving a store).  A failure prints "PROGRAM: what: reason" and
 * exits 1 (bc_die) or 2 (bc_die_rv, BC_CHECK: the benchmarks whose exit
 * status 1 means a missed target): a benchmark has nothing to recover.
 */
#ifndef HR_PERF_BENCH_COMMON_H
#define HR_PERF_BENCH_COMMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <hurray/engine.h>
#include <hurray/gpu.h>
#include <hurray/store.h>
#include <hurray/tensor.h>

/* Prints "PROGRAM: what: strerror(errno)" and exits 1. */
_Noreturn void bc_die(const char *what);

/* Prints "PROGRAM: what: hr_strerror(rv)" and exits 2. */
_Noreturn void bc_die_rv(const char *what, int rv);

/* Runs `call` (an HR_ERR_* result) and dies with bc_die_rv() unless it
 * returns 0. */
#define BC_CHECK(what, call)                                                   \
  do {                                                                         \
    int bc_rv_ = (call);                                                       \
    if (bc_rv_ != 0)                                                           \
      bc_die_rv(what, bc_rv_);                                                 \
  } while (0)

/* CLOCK_MONOTONIC in seconds. */
double bc_now_s(void);

/* CPU seconds (user and system) of the whole process so far, every
 * thread: a shared machine stretches wall time, not this. */
double bc_cpu_s(void);

/* A byte count from the command line: decimal, with an optional suffix
 * K, M or G (either case) for 2^10, 2^20, 2^30; anything else after the
 * digits is ignored. */
uint64_t bc_parse_size(const char *s);

/* The median of v[0..k) (k > 0), which it sorts. */
double bc_median(double *v, int k);

/* The options the device benchmarks share: when argv[*i] is
 * --backend NAME, --size BYTES[K|M|G] or --iters N (with its value
 * present), stores the value, advances *i past it and returns 1; else
 * returns 0 and leaves everything as it was. */
int bc_device_arg(int argc, char **argv, int *i, const char **backend,
                  uint64_t *size, int *iters);

/* Opens the device backend named `backend` and queries its caps into
 * *caps.  Returns the device (the caller deletes it), or NULL after
 * printing "SKIP: ..." when the backend is unavailable here (the
 * caller exits 77); any other failure dies with bc_die_rv(). */
hr_gpu *bc_gpu_open(const char *backend, hr_gpu_caps *caps);

/* A TCP socket listening on 127.0.0.1, port 0 (SO_REUSEADDR, backlog
 * 64); *port receives the port. */
int bc_listen_any(int *port);

/* A blocking TCP connection to 127.0.0.1:port with TCP_NODELAY. */
int bc_connect_to(int port);

/* The descriptor of a 1-D UINT8 ROW_MAJOR tensor of `bytes` bytes in one
 * buffer aligned to 2^align_log2. */
void bc_bytes_desc(hr_descriptor *d, uint64_t bytes, uint8_t align_log2);

/* A 1-D UINT8 ROW_MAJOR tensor of `bytes` bytes (a multiple of 8),
 * 64-byte aligned on the heap, filled with a pattern every word of
 * which differs. */
hr_tensor *bc_big_tensor(uint64_t bytes);

/* A hurray server on its own thread: a libevent loop, an engine made
 * with `cfg`, a TCP listener on 127.0.0.1:0 serving `store` and, when
 * `unix_path` is set, a Unix socket listener there too. */
typedef struct bc_server {
  pthread_t th;
  struct event_base *base;
  hr_engine *e;
  hr_store *store;
  hr_engine_config cfg;
  const char *unix_path;
  int port;
  atomic_int stop, ready;
} bc_server;

/* Starts the server and waits until it listens.  `cfg` NULL: the
 * defaults; its on_wakeup and user_data are the server's own, and what
 * it points to must live until bc_server_start() returns. */
void bc_server_start(bc_server *s, hr_store *store,
                     const hr_engine_config *cfg, const char *unix_path);

/* Closes the engine from its own thread (hr_engine_wakeup(), the one
 * thread-safe engine call) and joins the thread. */
void bc_server_stop(bc_server *s);

#endif /* HR_PERF_BENCH_COMMON_H */
