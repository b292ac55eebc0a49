/*
 * libhurray: the embeddable engine.
 *
 * An hr_engine drives hr_sessions (<hurray/session.h>) over real sockets
 * (TCP, TLS over TCP, Unix sockets) on the host's event loop.  The host
 * tells the engine which file descriptors are ready and when its single
 * timer fired; the engine tells the host which descriptors to watch and
 * when the timer is due — the shape of curl's multi_socket API.  The
 * libevent binding (<hurray/hr_event.h>) is built on this same interface.
 *
 * Threads: every engine call and every callback happens on the loop
 * thread, except hr_engine_wakeup().  The only threads the library creates
 * are the engine's worker pool (transcoding, and the bulk reads and writes
 * of tensor bytes: bulk_offload_min), started on its first job; their
 * completions come back to the loop thread through an eventfd the engine
 * watches like any other descriptor.
 *
 * Data path: the engine moves tensor bytes itself — gathering writes of
 * the session's iovecs, reads straight into the destination tensor — and
 * uses the host's loop only for readiness and the timer.
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
 *
 * Readiness is level-triggered: the host keeps reporting an fd while it
 * stays ready and watched.  The engine caps the bytes it moves per report
 * and connection (io_budget) so that busy connections take turns, and
 * relies on being called again for the rest.
 */
typedef struct hr_loop_ops {
  size_t size; /* sizeof(hr_loop_ops) */
  /* Watch `fd` for `events` (HR_POLL_IN|HR_POLL_OUT; 0: stop watching,
   * forget the fd).  Idempotent: called again with the same fd to change
   * the events.  `*fd_cookie` is the host's per-fd slot (starts NULL; the
   * host may store its own object there and gets the same pointer back on
   * every call for this fd; set it back to NULL on events 0).  The engine
   * always calls watch(fd, 0) before it closes `fd`, so a later fd with
   * the same number is a new one.  May be called from inside any engine
   * call.  Return 0 or a negative HR_ERR_*. */
  int (*watch)(void *loop_data, int fd, int events, void **fd_cookie);
  /* Arm the single timer to fire in `ms` milliseconds (0: on the next loop
   * turn), replacing the previous one; -1 cancels it. */
  int (*timer)(void *loop_data, int64_t ms);
  /* Monotonic clock in ns (NULL: CLOCK_MONOTONIC). */
  hr_tstamp (*now)(void *loop_data);
  /* Called once by hr_engine_del() after the engine stopped watching
   * everything and cancelled its timer, so a binding can free `loop_data`
   * (NULL: nothing to do). */
  void (*release)(void *loop_data);
  /* Optional (NULL: `timer` is used): `timer` in nanoseconds, for hosts
   * whose timer is finer than a millisecond (ns 0: the next loop turn, -1:
   * cancel).  With it, a fabric polled without a wait fd (shm) sleeps
   * between its polls (hr_fabric_config.poll_interval, 50 us) instead of
   * spinning through zero-timeout loop turns while a transfer runs.  The
   * libevent binding and the blocking client set it. */
  int (*timer_ns)(void *loop_data, int64_t ns);
} hr_loop_ops;

/* The host reports readiness (`revents`: HR_POLL_IN|HR_POLL_OUT, plus
 * errors as both) and timer expiry.  Callbacks run from inside these calls.
 * An fd the engine no longer watches is ignored.  A connection whose
 * session fails (a fatal error included) is closed and reported through
 * on_conn; the engine goes on.  Return 0, HR_ERR_INVALID_ARGUMENT (NULL
 * e), or HR_ERR_IN_CALLBACK when called from a callback. */
HR_EXTERN int hr_engine_on_fd(hr_engine *e, int fd, int revents);
HR_EXTERN int hr_engine_on_timeout(hr_engine *e);

/*
 * Sends what sessions queued while the engine was not running: call it
 * after hr_session_get/put/list/ping/cancel from the host's own code
 * (outside engine callbacks).  Inside callbacks it is not needed: the
 * engine writes every session's output before it returns to the loop.
 * Like hr_engine_on_fd(), callbacks may run from it.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (NULL e), or HR_ERR_IN_CALLBACK.
 */
HR_EXTERN int hr_engine_flush(hr_engine *e);

/* ------------------------------------------------------------------------ */
/* Engine                                                                    */
/* ------------------------------------------------------------------------ */

#define HR_ENGINE_CONFIG_VERSION 1

struct hr_tls_config; /* below, under "TLS" */
struct hr_inproc_hub; /* <hurray/inproc.h> */

typedef struct hr_engine_config {
  int version;                 /* HR_ENGINE_CONFIG_VERSION */
  hr_settings session;         /* defaults for every session (pointers inside
                                  are deep-copied) */
  unsigned worker_threads;     /* pool size (0: number of CPUs, at most 8);
                                  threads start on the first work item */
  uint32_t max_connections;    /* server: accepted connections (1024); one
                                over the cap gets ERROR RESOURCE_EXHAUSTED on
                                stream 0 and is closed */
  uint64_t max_inflight_bytes; /* server: bytes of PUT landing buffers
                             allocated at once, across all connections
                             (1 GiB); a PUT over it is refused with
                             RESOURCE_EXHAUSTED (0: no cap) */
  /* ---- appended in 0.1 (all zero-initialisable) ---- */
  uint64_t drain_timeout; /* ns hr_engine_close() waits for connections
                             to finish before cutting them (30 s) */
  uint32_t io_budget;     /* bytes read or written per readiness report
                             and connection before the next connection's
                             turn (16 MiB) */
  int socket_buffer;      /* SO_SNDBUF/SO_RCVBUF in bytes (0: the kernel's
                             autotuning, the default) */
  /* Called on the loop thread after hr_engine_wakeup() (NULL: none). */
  void (*on_wakeup)(hr_engine *e, void *user_data);
  /* Every finished transfer of every connection, for logs and metrics
   * (NULL: none). */
  void (*on_transfer)(hr_conn *c, const hr_transfer_record *rec,
                      void *user_data);
  void *user_data; /* for on_wakeup, on_transfer, on_request, on_conn */
  /* ---- appended for TLS (NULL: none; see "TLS" below) ---- */
  /* Server: every TCP listener speaks TLS 1.3 with this certificate and
   * key (Unix socket listeners stay plain). */
  const struct hr_tls_config *tls_server;
  /* Client: how "hurrays://" connections verify the server and which
   * certificate they present (NULL: the system's trust store, no client
   * certificate). */
  const struct hr_tls_config *tls_client;
  /* ---- appended: the RDMA data plane (fabric/; all 0: frames only) ---- */
  /* The fabric every session of this engine shares: the application's
   * (it must outlive the engine; the engine never frees it) ... */
  struct hr_fabric *fabric;
  /* ... or, with fabric NULL, a provider name ("tcp;ofi_rxm", "shm",
   * "verbs;ofi_rxm", ...; "auto": the best one, hr_fabric_config) for a
   * fabric the engine opens in hr_engine_new() and closes in
   * hr_engine_del(), with its endpoint on `fabric_node` (a local address
   * such as "127.0.0.1"; NULL: the provider's default). */
  const char *fabric_provider;
  const char *fabric_node;
  /* Capability flags the sessions advertise for it (0:
   * hr_fabric_capabilities()).  Tests set HR_CAP_RDMA_GPUDIRECT to
   * exercise destination registration with host memory. */
  uint32_t fabric_caps;
  /* ---- appended for the SHM data plane ---- */
  int no_shm; /* 1: never use the SHM data plane (wire-v1 § 14) on Unix
                 sockets; 0 (default): advertise it there, as server and
                 client, and answer/accept GETs over shared segments */
  /* ---- appended in 0.1 (0: the default; UINT64_MAX: no cap) ---- */
  uint64_t max_put_bytes; /* server: tensor bytes one PUT may declare
                             (1 GiB); a PUT over it is refused with
                             RESOURCE_EXHAUSTED before anything is
                             allocated */
  uint64_t max_conn_inflight_bytes; /* server: bytes of PUT landing
                             buffers one connection may hold at once
                             (1 GiB), within max_inflight_bytes; a PUT
                             over it is refused with RESOURCE_EXHAUSTED */
  /* ---- appended for logs and metrics (NULL: none) ---- */
  /* Server: a request that moved no tensor bytes (LIST, PING, or a GET or
   * PUT refused before it became a stream), as
   * hr_session_callbacks.on_request reports it. */
  void (*on_request)(hr_conn *c, const hr_transfer_record *rec,
                     void *user_data);
  /* A connection's life, `event` one of HR_CONN_OPENED (server: accepted;
   * client: the connect completed), HR_CONN_CLOSED (once per OPENED, when
   * it is torn down; hr_conn_error() and hr_conn_bytes() tell why and how
   * much; its completions have run), HR_CONN_REJECTED (server: accepted
   * over max_connections, answered RESOURCE_EXHAUSTED; never OPENED).
   * hr_conn_peer() and hr_conn_role() work in it. */
  void (*on_conn)(hr_conn *c, int event, void *user_data);
  /* ---- appended for the SHM mapping cache ---- */
  /* Client: segments received over SHM that are sealed against shrinking
   * (memfds: arenas, per-tensor segments) are mapped whole once and the
   * mapping is shared by every GET that receives the same file (keyed by
   * device, inode and size), so a GET costs no mmap.  Mappings in use
   * stay; idle ones are kept up to shm_map_cache entries (0: 16; -1:
   * none, every GET maps and unmaps its own range) and
   * shm_map_cache_bytes bytes (0: 4 GiB), least recently used out first.
   * An idle mapping keeps the server's pages of that segment alive. */
  int shm_map_cache;
  uint64_t shm_map_cache_bytes;
  /* ---- appended: bulk I/O on the worker pool ---- */
  /* A plain (not TLS) connection's write of at least this many bytes of
   * output at once (tensor frames), or read of at least this many bytes
   * straight into a tensor, runs on a worker thread while the loop goes
   * on, so that the lanes of a session (or many connections) use several
   * cores.  0: the default (1 MiB); UINT64_MAX: never (all I/O on the
   * loop thread, as before 0.3).  See docs/internals/engine.md. */
  uint64_t bulk_offload_min;
  /* Whether a connection that is the engine's only one offloads too.  0
   * (the default): no, its bytes move on the loop thread, since one
   * stream is bounded by one core anyway and a handoff per piece only
   * costs (on 2 cores, a quarter of a 1 GiB GET's speed); offloading
   * starts when the engine has two connections or more (the lanes of a
   * session, several clients).  1: offload a lone connection as well. */
  int bulk_offload_lone;
  /* ---- appended: in-process connections ---- */
  /* The application's hub (<hurray/inproc.h>, hr_inproc_hub_new()) that
   * holds the names of this engine's "inproc:NAME" listeners and finds
   * the listener of an "inproc:NAME" connect.  Engines that share a hub
   * reach each other's listeners (one engine may also connect to itself);
   * nothing outside the hub, and nothing outside the process, can.  The
   * hub must outlive every engine configured with it (hr_inproc_hub_del()
   * answers HR_ERR_BUSY while a listener holds a name in it).  NULL (the
   * default): "inproc:" URLs fail with HR_ERR_UNSUPPORTED. */
  struct hr_inproc_hub *inproc_hub;
  /* ---- appended: how many bulk jobs at once ---- */
  /* The most bulk jobs (bulk_offload_min) the engine has out at once;
   * a connection that finds them all out moves its bytes on the loop
   * thread.  0 (the default): automatic, sized to the CPUs this process
   * may run on (its affinity mask): one less than them, since the loop
   * thread moves bytes too, and for a peer on the same host (loopback,
   * a Unix socket, our own address) one less than half of them, since
   * the peer's end needs the other half.  With one CPU per end that is
   * none: on 2 CPUs with both ends on them, every byte stays on the loop
   * threads (offloading only added handoffs: 2 to 8 lanes fell to 0.8 of
   * one lane).  N > 0: at most N, whatever the machine.  Negative:
   * hr_engine_new() fails with HR_ERR_INVALID_ARGUMENT.  See
   * docs/internals/engine.md, "Bulk I/O on the worker pool". */
  int bulk_offload_jobs;
} hr_engine_config;

/* hr_engine_config.on_conn events. */
#define HR_CONN_OPENED 1
#define HR_CONN_CLOSED 2
#define HR_CONN_REJECTED 3

/* Fills `c` with defaults (hr_settings_default() for the session part). */
HR_EXTERN void hr_engine_config_default(hr_engine_config *c);

/*
 * Creates an engine bound to the host's loop.  `ops` and `cfg` are copied
 * (cfg may be NULL: defaults).  Creates the worker pool (its threads start
 * on first use) and watches its completion eventfd.  Returns 0,
 * HR_ERR_INVALID_ARGUMENT (ops without watch or timer, a bad version, a
 * negative bulk_offload_jobs, a TLS configuration that does not load:
 * hr_tls_config_check() says why), HR_ERR_NOMEM, HR_ERR_IO (eventfd), the
 * error of ops->watch, or with fabric_provider set the errors of
 * hr_fabric_new() (HR_ERR_UNSUPPORTED: no such provider here) and
 * HR_ERR_INTERNAL (its address does not fit the HELLO extension).  On
 * success *out receives the engine, the caller's until hr_engine_del();
 * on failure every watch it made is removed again.
 */
HR_EXTERN int hr_engine_new(hr_engine **out, const hr_loop_ops *ops,
                            void *loop_data, const hr_engine_config *cfg,
                            const hr_mem *mem);

/* Begins shutdown: listeners close (their handles become invalid),
 * sessions send GOAWAY and drain (active streams finish, new ones are
 * refused); connections still open after drain_timeout are cut.  `on_closed`
 * (may be NULL) is called once, from an engine entry point on the loop thread,
 * when the last connection is gone; then hr_engine_del() succeeds.  New
 * connects fail with HR_ERR_STATE.  Returns 0, HR_ERR_INVALID_ARGUMENT
 * (NULL e), or HR_ERR_STATE when already closing. */
HR_EXTERN int hr_engine_close(hr_engine *e,
                              void (*on_closed)(hr_engine *e, void *ud),
                              void *ud);

/* Frees the engine (listeners included).  Returns HR_ERR_BUSY (and frees
 * nothing) while connections live or work items are out; HR_ERR_IN_CALLBACK
 * from a callback.  NULL is a no-op.  It does not wait for a host-name
 * lookup a worker is still running (getaddrinfo() cannot be interrupted):
 * that worker thread is detached, frees the answer with freeaddrinfo()
 * when the resolver returns and exits; it uses nothing of the engine, its
 * hr_mem or its loop then. */
HR_EXTERN int hr_engine_del(hr_engine *e);

/* Thread-safe: makes the loop thread run the engine soon (used by the
 * pool; exposed for hosts that hand work in from other threads): it then
 * calls config.on_wakeup and flushes every session. */
HR_EXTERN void hr_engine_wakeup(hr_engine *e);

/* The engine's fabric (configured or opened by it), or NULL.  With one,
 * every session advertises RDMA_DATA_PLANE and FABRIC_ADDRESS, the fabric's
 * completion fd joins the loop through hr_loop_ops and its expiry the
 * engine's timer; transfers between two such peers use the RDMA data plane
 * (docs/internals/fabric.md).  Valid until hr_engine_del(). */
HR_EXTERN struct hr_fabric *hr_engine_fabric(const hr_engine *e);

/* Connections alive (client and server, not counting sockets that only
 * linger to deliver a final ERROR). */
HR_EXTERN size_t hr_engine_conn_count(const hr_engine *e);

/* Streams open across those connections (hr_session_stream_count() of
 * each; O(connections)).  For metrics gauges. */
HR_EXTERN size_t hr_engine_stream_count(const hr_engine *e);

/* ------------------------------------------------------------------------ */
/* Server                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * Listens on `addr` ("HOST:PORT", "[v6]:PORT"; port 0 picks one; or
 * "unix:PATH", a Unix domain stream socket with the same framing) and
 * serves every accepted connection with `provider` (copied; its callbacks
 * run on the loop thread).  Every connection's SERVER_HELLO names its
 * session (SESSION_TOKEN, 16 bytes of getrandom()), so that a client may
 * join more connections to it (hr_engine_connect_group()); requests come
 * on lane 0, whose session the provider sees.  Server sessions get the engine's session
 * settings; hr_session_user_data() of such a session is its hr_conn.
 * `out` may be NULL.  Returns 0, HR_ERR_INVALID_ARGUMENT (bad address or
 * provider), HR_ERR_IO (bind/listen), HR_ERR_STATE (closing), HR_ERR_NOMEM.
 */
HR_EXTERN int hr_engine_listen(hr_engine *e, const char *addr,
                               const hr_provider *provider, hr_listener **out);
/*
 * A "unix:PATH" listener creates the socket file at PATH and removes it
 * when it closes.  A socket file already there is replaced only when a
 * connect to it is refused (a server that died); a live server's path
 * fails with HR_ERR_IO, and a file that is not a socket is left alone.
 * Unix sockets are a network transport for the wire rules (sync_mode 0,
 * device_index 0).
 *
 * On an engine with config.tls_server every TCP listener speaks TLS (see
 * "TLS" below); a Unix socket listener stays plain.  Over max_connections
 * a TLS connection is closed without the ERROR a plain one gets (a TLS
 * client could not read it before a handshake).
 */
/*
 * "inproc:NAME" (NAME 1-255 bytes) listens in-process under NAME in the
 * hub of config.inproc_hub: engines sharing that hub connect to it with
 * hr_engine_connect(e2, "inproc:NAME", ...), from any thread their own
 * loop runs on.  Each connection is the whole protocol over a private
 * AF_UNIX socketpair (a Unix socket in every respect: SHM, peer
 * credentials; nothing is named in the file system, and no other process
 * can reach it).  The name is the listener's until it closes (or its
 * engine closes), then free again.  Errors: HR_ERR_UNSUPPORTED (the
 * engine has no hub), HR_ERR_INVALID_ARGUMENT (empty or too long a name),
 * HR_ERR_BUSY (the name is taken in the hub, by a listener or an
 * hr_inproc_listen() server), HR_ERR_IO (socketpair), HR_ERR_NOMEM.
 */
/* The bound port (after port 0); -1 for a Unix socket or "inproc:". */
HR_EXTERN int hr_listener_port(const hr_listener *l);
/* Stops accepting and frees the listener; existing connections go on. */
HR_EXTERN void hr_listener_close(hr_listener *l);

/* ------------------------------------------------------------------------ */
/* Client                                                                    */
/* ------------------------------------------------------------------------ */

/* Called once when a client connection is established (both HELLOs
 * exchanged: status 0) or failed before that (an error; no second call
 * then), and once more when an established connection closes (status
 * HR_ERR_CLOSED after a clean close, HR_ERR_REMOTE when the peer sent an
 * ERROR on stream 0, HR_ERR_PROTO when we did, HR_ERR_TIMEOUT, HR_ERR_IO).
 * hr_conn_error() says more.  Every stream's completion has run before the
 * closing call.  `conn` stays valid until the close callback returns. */
typedef void (*hr_conn_cb)(hr_conn *c, int status, void *user_data);

/*
 * Connects to "hurray://HOST:PORT" (or "HOST:PORT", "hurrays://HOST:PORT"
 * for TLS, "unix:PATH" for a Unix domain socket, or "inproc:NAME" for a
 * listener of the engine's hub, see hr_engine_listen()) non-blockingly.
 * An "inproc:" connect hands its connection to the listener from inside
 * the call (the handshake follows on the loops as for any connection)
 * and fails from the call with HR_ERR_UNSUPPORTED (no config.inproc_hub,
 * or NAME is an hr_inproc_listen() server: use hr_inproc_connect()),
 * HR_ERR_NOT_FOUND (no listener has that name), HR_ERR_WOULDBLOCK (the
 * listener has too many connections it did not take yet: retry),
 * HR_ERR_INVALID_ARGUMENT (an empty or too long NAME) or HR_ERR_IO.  A
 * listener that closes before it took the connection closes it: `cb`
 * reports the failure.  A TLS
 * connection that fails its handshake (untrusted or misnamed server
 * certificate, a server that refuses our certificate, a peer that does
 * not speak TLS) closes with HR_ERR_IO and hr_conn_error()'s message
 * saying what failed.
 * `settings` NULL: the engine's defaults.  Requests may be queued on the
 * connection's session right away; they are sent after the handshake.
 *
 * Host names never block the loop thread.  A numeric HOST (an IPv4 or
 * IPv6 literal) and "unix:PATH" are connected from inside the call.  A
 * name (e.g. "localhost") is looked up with getaddrinfo() as a job on the
 * engine's worker pool (started on first use; config.worker_threads);
 * the connection stays connecting, without a socket, until the answer
 * comes back through the pool's eventfd, then connects to the first
 * address that takes the connect() call.  When that connect fails later
 * (the refusal or error comes with writability: "localhost" giving ::1
 * first to a server on 127.0.0.1 only), the connection goes on with the
 * next address of the answer, in getaddrinfo()'s order, one at a time
 * (no "happy eyeballs" race); it fails only when none is left, with
 * HR_ERR_IO and the last error, whose message names the address ("connect
 * to 127.0.0.1:4567: Connection refused").  The handshake_timeout is one
 * deadline for the lookup and all the attempts together, not one per
 * address: it ends the connection (HR_ERR_TIMEOUT, the message naming
 * the address being tried) whatever addresses are left.  The answer is
 * the connection's until it is open or gone.  A name that does not resolve
 * is reported through `cb`, never by this call: status
 * HR_ERR_INVALID_ARGUMENT, hr_conn_error()'s message "cannot resolve
 * HOST: reason".  The session's handshake_timeout, running from this
 * call, bounds the lookup too (HR_ERR_TIMEOUT).  hr_conn_close(),
 * hr_conn_abort() and hr_engine_close() during a lookup end the
 * connection at once (`cb` with HR_ERR_CLOSED); the lookup's answer is
 * dropped when it comes.  hr_engine_del() does not wait for a lookup a
 * worker is running (getaddrinfo() cannot be interrupted): the worker
 * thread is detached and frees the answer itself when the resolver
 * returns (see hr_engine_del()).  The lanes of
 * hr_engine_connect_group() connect to the address lane 0 got, without a
 * lookup of their own.
 *
 * Returns 0, HR_ERR_INVALID_ARGUMENT (NULL e or url, a malformed URL),
 * HR_ERR_IO (no worker thread could be started for a lookup, or a
 * connect that failed at once), HR_ERR_NOMEM, HR_ERR_STATE (the engine is
 * closing).  For a "hurrays://" URL on an engine without tls_client the
 * TLS context is made on first use from the system's trust store;
 * HR_ERR_IO if that fails (after a lookup such a failure goes through
 * `cb`).  When the call fails nothing was made and `cb` is never
 * called; otherwise *out (may be NULL) receives the connection, valid as
 * hr_conn_cb says.
 */
HR_EXTERN int hr_engine_connect(hr_engine *e, const char *url,
                                const hr_settings *settings, hr_conn_cb cb,
                                void *user_data, hr_conn **out);

/*
 * Connects one session over `lanes` connections to the server at `url`
 * (docs/protocol.md § 14.5; 1 to HR_MAX_LANES, 1 is hr_engine_connect()).
 * The connection returned is lane 0; once its HELLOs are exchanged the
 * engine opens the other lanes one after the other, each joining the
 * session with its SESSION_TOKEN.  `cb` reports status 0 when every lane
 * is up, or as many as could be had: a server that sends no token (it
 * keeps no multi-connection sessions) or a lane that fails to join leaves
 * the session with fewer (hr_conn_lanes() says how many), and then the
 * close of lane 0, which closes the other lanes.  Requests go on
 * hr_conn_session() of lane 0; the shards of a parallel GET arrive over
 * every lane, each straight into the one destination.  hr_conn_close(),
 * hr_conn_abort() and hr_conn_bytes() on lane 0 cover every lane.
 * Returns like hr_engine_connect(); HR_ERR_INVALID_ARGUMENT for a lane
 * count out of range.
 */
HR_EXTERN int hr_engine_connect_group(hr_engine *e, const char *url,
                                      unsigned lanes,
                                      const hr_settings *settings,
                                      hr_conn_cb cb, void *user_data,
                                      hr_conn **out);

/* Open lanes of a client connection made by hr_engine_connect_group()
 * (1 for any other connection, 0 once it closed). */
HR_EXTERN unsigned hr_conn_lanes(const hr_conn *c);

/* The connection's session: use hr_session_get/put/list/ping/cancel on
 * it.  Valid until the connection's close callback returns. */
HR_EXTERN hr_session *hr_conn_session(hr_conn *c);

/* Closes a connection gracefully (GOAWAY, then close once its streams are
 * done).  Deferred to the engine's next entry point; may be called from
 * callbacks. */
HR_EXTERN void hr_conn_close(hr_conn *c);

/* Cuts a connection without a GOAWAY: every stream completes with
 * HR_ERR_CLOSED.  Deferred like hr_conn_close(); may be called from
 * callbacks. */
HR_EXTERN void hr_conn_abort(hr_conn *c);

/* Why the connection closed or is closing: the wire error sent or received
 * on stream 0 (0 if none), whether we sent it, and a UTF-8 message (the
 * peer's text, or a local reason such as a socket error; "" if none; valid
 * while `c` is).  Any out pointer may be NULL.  Returns the status the
 * close callback gets (0 while the connection is healthy), or
 * HR_ERR_INVALID_ARGUMENT for a NULL `c`. */
HR_EXTERN int hr_conn_error(const hr_conn *c, uint32_t *wire_error, int *sent,
                            const char **message);

/* Bytes received and sent on the socket so far, those of its open lanes
 * included (any pointer may be NULL). */
HR_EXTERN void hr_conn_bytes(const hr_conn *c, uint64_t *rx, uint64_t *tx);

/* The credentials of a Unix socket's peer process, as the kernel reported
 * them (SO_PEERCRED) when the connection was made. */
typedef struct hr_peer_cred {
  int32_t pid;
  uint32_t uid;
  uint32_t gid;
} hr_peer_cred;

/*
 * The peer's credentials on a Unix socket connection: on a server, the
 * connecting process; on a client, the server's.  A server's provider may
 * authorise by them in its on_hello hook: hr_session_user_data() of the
 * hook's session is the hr_conn, and the hook refuses by setting
 * *wire_error to HR_WIRE_UNAUTHORIZED and returning 0, which the client
 * sees as HR_ERR_REMOTE with that wire error.  Returns
 * 0, HR_ERR_UNSUPPORTED (a TCP connection: it has none),
 * HR_ERR_INVALID_ARGUMENT.
 */
HR_EXTERN int hr_conn_peer_cred(const hr_conn *c, hr_peer_cred *out);

/* The peer's address as text: "1.2.3.4:5678", "[::1]:5678",
 * "unix:pid=N" (a Unix socket's peer process), or "" before a client's
 * connect completed.  Valid while `c` is.  NULL: "". */
HR_EXTERN const char *hr_conn_peer(const hr_conn *c);
/* HR_ROLE_SERVER (an accepted connection) or HR_ROLE_CLIENT; -1 for NULL. */
HR_EXTERN int hr_conn_role(const hr_conn *c);

/* ------------------------------------------------------------------------ */
/* TLS                                                                       */
/* ------------------------------------------------------------------------ */

/*
 * TLS 1.3 over TCP with OpenSSL (docs/protocol.md § 25.1).  A server
 * engine with config.tls_server makes every TCP listener a TLS one; a
 * client selects TLS per connection with the "hurrays://HOST:PORT" URL
 * (every lane of hr_engine_connect_group() too) and verifies the server
 * with config.tls_client.  Only TLS 1.3 is spoken.  The engine asks for
 * kernel TLS (SSL_OP_ENABLE_KTLS) and falls back to userspace TLS where
 * the kernel or the cipher does not have it; hr_conn_tls_info() says
 * which was used.
 *
 * Files are PEM.  They are read by hr_engine_new() (and
 * hr_tls_config_check()); the strings need not outlive that call.
 *
 * OpenSSL allocates through its own allocator, not the engine's hr_mem;
 * everything it allocated for a connection is freed when the connection
 * closes, and the contexts when the engine is deleted.
 */
struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

typedef struct hr_tls_config {
  /* Certificate chain (leaf first) and its private key.  Server: required
   * (unless ssl_ctx).  Client: optional, presented to a server that asks
   * for one (mutual TLS); give both or neither. */
  const char *cert_file;
  const char *key_file;
  /* Trust anchors.  Client: the CAs that may have issued the server's
   * certificate (NULL: the system's default store).  Server: when set,
   * every client must present a certificate issued by one of them
   * (mutual TLS); a client without one, or with another, fails the
   * handshake. */
  const char *ca_file;
  /* Client: the name the server's certificate must carry (DNS name, or an
   * IP address matched against IP SANs), also sent as SNI when it is a
   * name (NULL: the URL's host). */
  const char *server_name;
  /* The host's own context instead of the files above (NULL: none).  The
   * engine takes a reference (SSL_CTX_up_ref) and drops it in
   * hr_engine_del(), so the host may free its own at any time after
   * hr_engine_new().  The engine never changes the context; per
   * connection it requires TLS 1.3, sets the host name to verify (client)
   * and asks for kernel TLS.  Verification is the context's: a client
   * context must have SSL_VERIFY_PEER set for the server's certificate
   * and name to be checked. */
  struct ssl_ctx_st *ssl_ctx;
  int no_ktls; /* 1: never use kernel TLS */
} hr_tls_config;

/*
 * Loads `cfg` the way hr_engine_new() will (`server`: as tls_server,
 * else as tls_client) and discards the result: for a clear message before
 * starting.  `why` (may be NULL) receives one line on failure (the file,
 * and OpenSSL's reason, e.g. "the key does not match the certificate").
 * Returns 0, HR_ERR_INVALID_ARGUMENT (a file does not load, key mismatch,
 * a server without certificate, a client with only one of cert/key),
 * HR_ERR_NOMEM.
 */
HR_EXTERN int hr_tls_config_check(const hr_tls_config *cfg, int server,
                                  char *why, size_t why_len);

/* What a TLS connection negotiated. */
typedef struct hr_tls_info {
  char version[16];       /* "TLSv1.3" */
  char cipher[64];        /* e.g. "TLS_AES_128_GCM_SHA256" */
  int ktls_tx;            /* sends go through kernel TLS */
  int ktls_rx;            /* receives go through kernel TLS */
  int peer_cert;          /* the peer presented a certificate that verified */
  char peer_subject[256]; /* its subject, one line ("" without one) */
} hr_tls_info;

/*
 * The TLS state of a connection (lane 0's for a group) once its handshake
 * finished.  Returns 0, HR_ERR_UNSUPPORTED (a plain connection),
 * HR_ERR_STATE (the handshake has not finished), HR_ERR_INVALID_ARGUMENT.
 */
HR_EXTERN int hr_conn_tls_info(const hr_conn *c, hr_tls_info *out);

/* A tap on the raw byte stream (debugging, `hurray get --dump-wire`):
 * `rx` sees every byte received, `tx` every byte sent, in order, on the
 * loop thread.  NULL removes a tap. */
typedef void (*hr_tap_fn)(const void *bytes, size_t len, void *user_data);
HR_EXTERN void hr_conn_set_tap(hr_conn *c, hr_tap_fn rx, hr_tap_fn tx,
                               void *user_data);

#ifdef __cplusplus
}
#endif
#endif /* HURRAY_ENGINE_H */
