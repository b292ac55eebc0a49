/*
 * libhurray: the embeddable engine.
 *
 * An hr_engine drives hr_sessions (<hurray/session.h>) over real sockets
 * (TCP; Unix sockets and TLS later) on the host's event loop.  The host
 * tells the engine which file descriptors are ready and when its single
 * timer fired; the engine tells the host which descriptors to watch and
 * when the timer is due — the shape of curl's multi_socket API.  The
 * libevent binding (<hurray/hr_event.h>) is built on this same interface.
 *
 * Threads: every engine call and every callback happens on the loop
 * thread, except hr_engine_wakeup().  The only threads the library creates
 * are the engine's worker pool (transcoding, file reads); their
 * completions come back to the loop thread through an eventfd the engine
 * watches like any other descriptor.
 *
 * Callbacks must not call hr_engine_del(); everything else is allowed
 * from callbacks unless its doc says otherwise.
 */
#ifndef HURRAY_ENGINE_H
#define HURRAY_ENGINE_H

#include <hurray/common.h>
#include <hurray/session.h>
#include <hurray/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hr_engine hr_engine;
typedef struct hr_conn hr_conn;         /* one connection (client or server) */
typedef struct hr_listener hr_listener; /* a listening socket */

/* ------------------------------------------------------------------------ */
/* The external-loop interface                                               */
/* ------------------------------------------------------------------------ */

#define HR_POLL_IN 1
#define HR_POLL_OUT 2

/*
 * What the host's loop provides.  The hooks must not call into the engine
 * (a zero timeout is delivered on the next loop turn, not by recursion).
 */
typedef struct hr_loop_ops {
  size_t size; /* sizeof(hr_loop_ops) */
  /* Watch `fd` for `events` (HR_POLL_IN|HR_POLL_OUT; 0: stop watching,
   * forget the fd).  Idempotent: called again with the same fd to change
   * the events.  `*fd_cookie` is the host's per-fd slot (starts NULL; the
   * host may store its own object there and gets the same pointer back on
   * every call for this fd).  Return 0 or a negative HR_ERR_*. */
  int (*watch)(void *loop_data, int fd, int events, void **fd_cookie);
  /* Arm the single timer to fire in `ms` milliseconds (0: on the next loop
   * turn), replacing the previous one; -1 cancels it. */
  int (*timer)(void *loop_data, int64_t ms);
  /* Monotonic clock in ns (NULL: CLOCK_MONOTONIC). */
  hr_tstamp (*now)(void *loop_data);
} hr_loop_ops;

/* The host reports readiness (`revents`: HR_POLL_IN|HR_POLL_OUT, plus
 * errors as both) and timer expiry.  Return 0 or a fatal error. */
HR_EXTERN int hr_engine_on_fd(hr_engine *e, int fd, int revents);
HR_EXTERN int hr_engine_on_timeout(hr_engine *e);

/* ------------------------------------------------------------------------ */
/* Engine                                                                    */
/* ------------------------------------------------------------------------ */

#define HR_ENGINE_CONFIG_VERSION 1

typedef struct hr_engine_config {
  int version;            /* HR_ENGINE_CONFIG_VERSION */
  hr_settings session;    /* defaults for every session */
  unsigned worker_threads;/* pool size (0: number of CPUs, at most 8) */
  uint32_t max_connections; /* server: accepted connections (1024) */
  uint64_t max_inflight_bytes; /* server: across all connections (1 GiB) */
} hr_engine_config;

/* Fills `c` with defaults (hr_settings_default() for the session part). */
HR_EXTERN void hr_engine_config_default(hr_engine_config *c);

/*
 * Creates an engine bound to the host's loop.  `ops` and `cfg` are copied
 * (cfg may be NULL: defaults).  Starts the worker pool.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT, HR_ERR_NOMEM, HR_ERR_IO (eventfd, threads).
 */
HR_EXTERN int hr_engine_new(hr_engine **out, const hr_loop_ops *ops,
                            void *loop_data, const hr_engine_config *cfg,
                            const hr_mem *mem);

/* Begins shutdown: listeners close, sessions send GOAWAY and drain.
 * `on_closed` is called (on the loop thread) when the last connection is
 * gone; then hr_engine_del() succeeds. */
HR_EXTERN int hr_engine_close(hr_engine *e,
                              void (*on_closed)(hr_engine *e, void *ud),
                              void *ud);

/* Frees the engine.  Returns HR_ERR_BUSY (and frees nothing) while
 * connections live; HR_ERR_IN_CALLBACK from a callback. */
HR_EXTERN int hr_engine_del(hr_engine *e);

/* Thread-safe: makes the loop thread run the engine soon (used by the
 * pool; exposed for hosts that hand work in from other threads). */
HR_EXTERN void hr_engine_wakeup(hr_engine *e);

/* ------------------------------------------------------------------------ */
/* Server                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * Listens on `addr` ("HOST:PORT", "[v6]:PORT"; port 0 picks one) and
 * serves every accepted connection with `provider` (copied).  *out may be
 * NULL.  Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_IO.
 */
HR_EXTERN int hr_engine_listen(hr_engine *e, const char *addr,
                               const hr_provider *provider,
                               hr_listener **out);
/* The bound port (after port 0). */
HR_EXTERN int hr_listener_port(const hr_listener *l);
/* Stops accepting; existing connections go on. */
HR_EXTERN void hr_listener_close(hr_listener *l);

/* ------------------------------------------------------------------------ */
/* Client                                                                    */
/* ------------------------------------------------------------------------ */

/* Called once when a client connection is established (status 0) or
 * failed, and once more when it closes (status HR_ERR_CLOSED or an
 * error).  `conn` stays valid until the close callback returns. */
typedef void (*hr_conn_cb)(hr_conn *c, int status, void *user_data);

/*
 * Connects to "hurray://HOST:PORT" (or "HOST:PORT") non-blockingly.
 * `settings` NULL: the engine's defaults.  Requests may be queued on the
 * connection's session right away; they are sent after the handshake.
 * Returns 0, HR_ERR_INVALID_ARGUMENT, HR_ERR_IO, HR_ERR_NOMEM.
 */
HR_EXTERN int hr_engine_connect(hr_engine *e, const char *url,
                                const hr_settings *settings, hr_conn_cb cb,
                                void *user_data, hr_conn **out);

/* The connection's session: use hr_session_get/put/list/ping/cancel on
 * it.  Valid until the connection's close callback returns. */
HR_EXTERN hr_session *hr_conn_session(hr_conn *c);

/* Closes a connection gracefully (GOAWAY, then close once idle). */
HR_EXTERN void hr_conn_close(hr_conn *c);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_ENGINE_H */
