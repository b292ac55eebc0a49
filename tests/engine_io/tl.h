/*
 * Test harness of tests/engine_io: event loops that drive engines, test
 * tensors and their checks, and a raw socket peer.
 *
 * Loops.  A tl_env runs any number of engines on one loop of one of two
 * kinds: an epoll loop written here against hr_loop_ops (the seam a host
 * with its own loop uses), or a libevent event_base through hr_ev_attach().
 * Tests run every flow through both.
 */
#ifndef HR_TL_H
#define HR_TL_H

#include <stddef.h>
#include <stdint.h>

#include <hurray/engine.h>
#include <hurray/store.h>
#include <hurray/tensor.h>

enum { TL_EPOLL = 0, TL_LIBEVENT = 1 };

/* The deadline of a wait for I/O, a timer or another thread.  Generous,
 * so that a loaded machine (CI on two cores, sanitizers) never trips it;
 * every wait ends as soon as its condition holds, so a passing test does
 * not take longer for it. */
#define TL_WAIT_MS 20000

typedef struct tl_env tl_env;

tl_env *tl_new(int mode);
/* Frees the loop (every engine must be deleted first). */
void tl_free(tl_env *env);
int tl_mode(const tl_env *env);
/* Creates an engine on the loop (cfg NULL: defaults). */
hr_engine *tl_engine(tl_env *env, const hr_engine_config *cfg);
/* The same on an epoll loop, the engine reading its time from
 * clock(ud) (hr_loop_ops.now) instead of CLOCK_MONOTONIC; the loop's
 * timers still run on the real clock. */
hr_engine *tl_engine_clock(tl_env *env, const hr_engine_config *cfg,
                           hr_tstamp (*clock)(void *ud), void *ud);
/* Runs the loop until done(ud) returns non-zero or timeout_ms passed.
 * Returns 1 when done, 0 on timeout. */
int tl_run(tl_env *env, int (*done)(void *), void *ud, int timeout_ms);
/* Runs the loop for `ms` milliseconds. */
void tl_spin(tl_env *env, int ms);
/* Runs the loop until engine `e` holds at most `n` connections (a peer's
 * close reaches the engine a turn of the loop or more after the peer
 * made it), at most TL_WAIT_MS.  Returns 1 when it does, 0 on timeout. */
int tl_wait_conns(tl_env *env, hr_engine *e, size_t n);
/* Closes the engine gracefully, runs until it closed, deletes it and
 * checks that hr_engine_del() succeeded. */
void tl_engine_finish(tl_env *env, hr_engine *e);

/* ---- tensors ----------------------------------------------------------- */

/* A byte of the deterministic fill for (seed, position). */
static inline uint8_t tl_byte(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32 | seed);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return (uint8_t)x;
}

/*
 * A tensor of `layout` (ROW_MAJOR, COLUMN_MAJOR, PERMUTED with `param`
 * the order, TILED with `param` the tiles, STRIDED: row-major strides
 * reversed with origin) filled with tl_byte(seed, ...).  `param` may be
 * NULL (defaults: reversed order, tiles of 2).  Always succeeds.
 */
hr_tensor *tl_tensor(uint8_t elem, uint8_t layout, unsigned rank,
                     const uint64_t *shape, const uint32_t *param,
                     uint32_t seed);
/* A ROW_MAJOR tensor. */
hr_tensor *tl_dense(uint8_t elem, unsigned rank, const uint64_t *shape,
                    uint32_t seed);

/*
 * A SPARSE_COO (INT32 indices; `sorted` as given) or SPARSE_CSR tensor of
 * FLOAT32 with `nnz` entries at the coordinates rows[i], cols[i] and the
 * values vals[i] (CSR: the coordinates must be sorted row-major).  Rank 2.
 */
hr_tensor *tl_sparse(uint8_t layout, uint64_t r, uint64_t c, size_t nnz,
                     const uint32_t *rows, const uint32_t *cols,
                     const float *vals, int sorted);

/* The address of logical element `idx` in a dense tensor of descriptor
 * `d` (ROW/COLUMN_MAJOR, STRIDED, PERMUTED, TILED, PANEL) held in `buf`. */
const uint8_t *tl_elem(const hr_descriptor *d, const void *buf,
                       const uint64_t *idx);

/*
 * Checks that `got` holds the logical elements of `ref` inside the box
 * (offset, shape) of ref's index space — `got`'s own shape must be the
 * box's (offset NULL: the whole tensor).  Layouts may differ.  Returns 1
 * when equal; prints the first difference otherwise.
 */
int tl_same_elements(hr_tensor *ref, const uint64_t *offset, hr_tensor *got);

/* ---- raw peers --------------------------------------------------------- */

/* A blocking-with-timeout TCP connection to 127.0.0.1:port (-1 on error). */
int tl_raw_connect(int port);
/* A listening socket on 127.0.0.1, port 0; *port receives the port. */
int tl_raw_listen(int *port);
/* A socket bound to 127.0.0.1, port 0, that does not listen; *port
 * receives the port.  Connects to the port are refused, and while the
 * socket is open no other process (tests run in parallel) can listen
 * there, which a listener closed at once would not ensure. */
int tl_raw_dead_port(int *port);
/* Writes everything, running the loop of `env` (may be NULL) while the
 * socket is full.  Returns 0 or -1 (the peer is gone). */
int tl_raw_send(tl_env *env, int fd, const void *p, size_t n);
/* Encodes `m` and sends it.  Returns 0 or -1. */
int tl_raw_send_msg(tl_env *env, int fd, const hr_msg *m);
/* A CLIENT_HELLO (or SERVER_HELLO when `server`) with default contents. */
void tl_hello(hr_msg *m, int server);

/* Reads one whole message from `fd` into `buf` (cap bytes), running the
 * loop of `env` meanwhile so that engines on it make progress.  Returns
 * the message length, 0 on EOF, -1 on timeout or error, -2 when the
 * payload was larger than `buf` (it was read and dropped). */
int64_t tl_raw_read_msg(tl_env *env, int fd, uint8_t *buf, size_t cap,
                        int timeout_ms);
/* Reads until the peer closes (1) or timeout (0), discarding. */
int tl_raw_wait_eof(tl_env *env, int fd, int timeout_ms);
/* Reads messages until one of type `type` (on `stream`, or any stream
 * when stream is UINT32_MAX) arrives; decodes it into *m (pointing into
 * buf).  Returns 1, or 0 on EOF/timeout. */
int tl_raw_expect(tl_env *env, int fd, uint32_t type, uint32_t stream,
                  uint8_t *buf, size_t cap, hr_msg *m, int timeout_ms);

/* ---- a server -------------------------------------------------------- */

/* A store-backed server listening on 127.0.0.1:0. */
typedef struct tl_server {
  hr_engine *e;
  hr_store *store;
  hr_listener *lis;
  int port;
  char url[64];
} tl_server;

/* Starts a server on a new engine of `env`; `ecfg`/`scfg` may be NULL. */
void tl_server_start(tl_env *env, tl_server *s, const hr_engine_config *ecfg,
                     const hr_store_config *scfg);
void tl_server_stop(tl_env *env, tl_server *s);
/* Puts `t` under `key` (the reference is kept by the store). */
void tl_put(tl_server *s, const char *key, hr_tensor *t);

#endif /* HR_TL_H */
