/*
 * What the loopback benchmarks share (perf/engine_bench.c, tls_bench.c,
 * shm_bench.c): clocks, a raw TCP listener and connect on 127.0.0.1, a
 * patterned tensor, and a hurray server on its own thread (a libevent
 * loop serving a store).  A failure prints "PROGRAM: what: reason" and
 * exits 1: a benchmark has nothing to recover.
 */
#ifndef HR_PERF_BENCH_COMMON_H
#define HR_PERF_BENCH_COMMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <hurray/engine.h>
#include <hurray/store.h>
#include <hurray/tensor.h>

/* Prints "PROGRAM: what: strerror(errno)" and exits 1. */
_Noreturn void bc_die(const char *what);

/* CLOCK_MONOTONIC in seconds. */
double bc_now_s(void);

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
