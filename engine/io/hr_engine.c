/*
 * The engine: hr_sessions over non-blocking TCP sockets, driven by the
 * host's loop through hr_loop_ops.
 *
 * Shape.  Every entry point (hr_engine_on_fd, hr_engine_on_timeout,
 * hr_engine_flush) raises `depth`, does its work, and on the way out runs
 * settle(): every connection's pending output is written (the write is
 * always tried before HR_POLL_OUT is armed), connections that are done are
 * torn down, watches are brought up to date and the single timer is
 * re-armed from the earliest session deadline.  Calls the host makes
 * outside an entry point that need callbacks (closing a connection,
 * closing the engine) only mark the work and arm a zero timer, so no user
 * callback ever runs from inside the call that caused it.
 *
 * Data path (see guides/performance.md): tensor bytes never pass through
 * a staging copy on the bulk path.  Output is one gathering write
 * (sendmsg: writev with MSG_NOSIGNAL) of the session's iovecs (frame
 * prefixes plus pointers into tensors); input is recv() straight into
 * hr_session_recv_target() when the session names a destination, and
 * into a 64 KiB staging buffer for control messages.  Large writes and
 * reads of a plain socket run on the worker pool (hr_bulk.h: one job per
 * connection and direction, the session holding the memory with
 * hr_session_io_hold() and stopping the job through io_fence before it
 * drops it), so that lanes and busy connections use several cores.
 *
 * Teardown.  A finished connection's session is terminated (its streams'
 * completions run), the client's close callback runs, and the socket
 * lingers half-closed for up to a second so that a final ERROR or GOAWAY
 * reaches the peer before close() could turn into a reset.  A session
 * with work items still on the pool is freed only when they are back.
 *
 * Lanes (docs/protocol.md § 14.5).  A server session may be joined: every
 * server session is attached to the engine's token registry, fed by
 * getrandom().  A client session over several connections is a lead
 * connection (lane 0, the one the application holds) and lane
 * connections the engine opens one after the other once the lead is up,
 * each joining with the session's token; the application hears that the
 * lead is up when every lane is (or when the server took fewer).  Lanes
 * close with their lead.  Since settle() flushes every connection, the
 * output one lane's session gives another (a CANCEL queued on lane 0 by a
 * fault on lane 2, a shard answered on lane 1) goes out in the same turn.
 */
#include <hurray/engine.h>

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifdef HR_HAVE_FABRIC
#include <hurray/fabric.h>
#endif

#include "hr_bulk.h"
#include "hr_engine_ext.h"
#include "hr_inproc_names.h"
#include "hr_internal.h"
#include "hr_pool.h"
#include <hurray/shm.h>

#include "hr_shm_io.h"
#include "hr_sock.h"
#include "hr_tls.h"
#include "../core/hr_rdma_stage.h"

#define STAGING_SIZE (64u * 1024u)
#define IOV_BATCH 128
#define ACCEPT_BATCH 64
#define MAX_REJECTING 64
#define LINGER_NS (1000000000ull)
#define ACCEPT_PAUSE_NS (100000000ull)
#define SETTLE_PASSES 4
/* PUTs of at least this many bytes land in a shared segment. */
#define SHM_PUT_MIN_BYTES ((uint64_t)1 << 20)

enum obj_kind { OBJ_CONN = 1, OBJ_LISTENER, OBJ_WAKE, OBJ_FABRIC };

/* What an fd slot points at: every watched object starts with this. */
typedef struct obj {
  int kind; /* enum obj_kind */
} obj;

enum conn_state {
  CS_CONNECTING, /* client: non-blocking connect in progress */
  CS_OPEN,       /* the session runs */
  CS_LINGER,     /* session gone; the socket drains half-closed */
  CS_DEAD        /* socket closed; waits for work items, then freed */
};

typedef struct put_acct {
  uint32_t stream_id;
  uint64_t bytes;
} put_acct;

struct hr_conn {
  obj o;
  hr_engine *e;
  hr_conn *prev, *next; /* in e->conns, e->lingering or e->dead */
  int fd;
  void *cookie; /* the host's per-fd slot */
  int watching; /* events last passed to ops->watch */
  int state;    /* enum conn_state */
  int role;     /* HR_ROLE_* */
  hr_session *s;
  hr_provider user_prov; /* server: the application's provider */
  hr_conn_cb cb;
  void *ud;
  int notified_up;   /* cb(0) ran */
  int want_close;    /* settle tears it down */
  int close_status;  /* for the close callback */
  int out_blocked;   /* a write came short, or the byte budget ran out:
                        wait for HR_POLL_OUT */
  int graceful_req;  /* hr_conn_close() or engine close asked */
  int graceful_done; /* hr_session_shutdown() was called */
  int peer_eof;      /* the peer closed its side */
  unsigned work_inflight;
  uint64_t rx_bytes, tx_bytes;
  /* Why it closed. */
  uint32_t wire_error;
  int wire_sent;
  char message[256];
  hr_tap_fn tap_rx, tap_tx;
  void *tap_ud;
  /* Accepted PUTs holding landing-buffer bytes (max_inflight_bytes). */
  put_acct *puts;
  size_t nputs, cap_puts;
  uint64_t put_bytes; /* max_conn_inflight_bytes accounting */
  /* Linger: bytes still to send before the half-close (a rejection's
   * ERROR), and the deadline of the drain. */
  uint8_t pre[160];
  size_t pre_off, pre_len;
  int shut_wr;
  hr_tstamp linger_until;
  int is_reject; /* never counted as a connection */
  /* Lanes of a client session: the lead (lane 0) lists its lanes. */
  hr_conn *lead;         /* a lane: its lead (NULL once the lead is gone) */
  hr_conn *lane_next;    /* a lane: the next lane of its lead */
  hr_conn *lanes;        /* the lead: its lanes */
  hr_group *grp;         /* the lead: the session's group */
  unsigned lanes_wanted; /* the lead: connections asked for (0: done) */
  int lane_step;         /* the lead: settle opens the next lane */
  hr__addr addr;         /* the lead: where its lanes connect */
  /* A Unix socket's peer (SO_PEERCRED when it connected). */
  int has_cred;
  hr_peer_cred cred;
  hr__tls *tls; /* the TLS transport, or NULL: the plain socket */
  /* Logs and metrics: the peer's address, and whether on_conn saw it
   * open (so that a failed connect reports no close). */
  char peer[HR_SOCK_PEER_MAX];
  int opened;
  /* A client connection whose host name is being looked up on the worker
   * pool (no socket yet), and, on a lead, the address it connected to:
   * its lanes connect there without a lookup of their own (0: none). */
  struct lookup *lookup;
  struct sockaddr_storage lane_sa;
  socklen_t lane_salen;
  /* Bulk I/O on the worker pool (hr_bulk.h): the jobs (made on first
   * use), whether each is out, and whether the last one stalled (the
   * loop then moves that direction's bytes itself until it sees a fast
   * peer again). */
  hr__bulk *btx, *brx;
  int tx_out, rx_out;
  int tx_slow, rx_slow;
  /* Whether the peer runs on this host's CPUs (hr__bulk_fd_same_host),
   * read on the first bulk-sized transfer: 0 unknown, 1 no, 2 yes. */
  int peer_host;
  /* A client connection whose host name gave more than one address: the
   * whole answer (owned, freed by conn_ais_free()) and the entry after
   * the one being connected to, where the next attempt goes on when this
   * connect fails (conn_next_addr()).  NULL when there is none left. */
  struct addrinfo *ais;
  const struct addrinfo *ai_rest;
};

struct hr_listener {
  obj o;
  hr_engine *e;
  hr_listener *next;
  int fd;
  void *cookie;
  int watching;
  int closed;
  int port;
  char path[HR_SOCK_PATH_MAX + 1]; /* a Unix socket's file, or "" */
  hr_provider prov;
  int tls; /* connections speak TLS (TCP with config.tls_server) */
  /* "inproc:NAME": the hub's name table, and NAME (fd is the receiving
   * end of the hand-over socket, hr_inproc_names.h). */
  hr__inproc_names *inames;
  char iname[HR__INPROC_NAME_MAX + 1];
};

typedef struct job {
  hr__job base; /* first: the pool hands back hr__job pointers */
  hr_work *w;   /* a session's work item, or NULL: a name lookup */
  hr_conn *c;
} job;

/* A host name lookup on the worker pool: getaddrinfo() may block for
 * seconds, never on the loop thread.  It is a detachable job (hr_pool.h):
 * the worker runs on a copy of `io`, reading `addr` and writing `res`,
 * `rv` and `why`, and copies the answer back when it is done; the loop
 * thread then connects with it (lookup_done), or frees it when the
 * connection went meanwhile (j.c is then NULL).  hr_engine_del() does not
 * wait for a lookup that is running: the worker frees its answer itself
 * (lookup_drop) and the engine frees the lookup (lookups_free). */
typedef struct lookup_io {
  hr__addr addr;
  struct addrinfo *res;
  int rv;
  char why[256];
} lookup_io;

typedef struct lookup {
  job j; /* first; j.w is NULL */
  lookup_io io;
  struct lookup *next; /* in e->lookups until taken back */
} lookup;

_Static_assert(sizeof(lookup_io) <= HR__POOL_IO_MAX,
               "a lookup's io fits a worker's copy");

struct hr_engine {
  hr_mem mem;
  hr_loop_ops ops;
  void *loop_data;
  hr_engine_config cfg;
  /* Deep copies of the pointers inside cfg.session. */
  uint8_t *devices_copy, *token_copy;
  char *peer_name_copy;

  int depth;          /* entry points and callbacks in progress */
  int in_user_cb;     /* inside a user callback (hr_engine_del forbidden) */
  int settle_pending; /* work marked outside an entry point */
  hr_conn *conns;     /* CONNECTING and OPEN */
  hr_conn *lingering; /* CS_LINGER */
  hr_conn *dead;      /* CS_DEAD with work out */
  size_t nconns, nserver, nrejecting;
  hr_listener *listeners;
  /* fd -> object map; fds are small integers. */
  obj **fdmap;
  size_t fdmap_len;

  obj wake;
  int wake_fd;
  void *wake_cookie;
  hr__pool *pool;
  unsigned pool_threads;
  uint64_t bulk_min; /* cfg.bulk_offload_min, UINT64_MAX: never */
  /* Bulk jobs out now, and the most at once (hr__bulk_jobs_max) for a
   * peer elsewhere and a peer on this host. */
  unsigned bulk_out, bulk_max_remote, bulk_max_local;

  hr_tstamp timer_at;      /* deadline the host's timer is armed for */
  hr_tstamp accept_resume; /* listeners paused (EMFILE) until then */
  int accept_paused;

  int closing;
  int shutdown_sent;
  hr_tstamp drain_deadline;
  void (*on_closed)(hr_engine *, void *);
  void *closed_ud;
  int closed_notified;

  uint64_t put_bytes; /* max_inflight_bytes accounting */
  uint8_t *staging;
  hr_registry *reg; /* server: sessions that connections may join */
  hr__engine_ext *ext; /* the in-process pair (hr_engine_ext.h) */
  hr__tls_ctx *tls_srv, *tls_cli; /* TLS contexts (NULL: none yet) */
  /* The RDMA data plane: the fabric, whether the engine opened it, its
   * completion fd's watch, and the FABRIC_ADDRESS HELLO extension. */
  struct hr_fabric *fabric;
  int own_fabric;
  obj fab_obj;
  int fab_fd;
  void *fab_cookie;
  int fab_watching;
  uint8_t fab_ext[600];
  /* Client: the SHM mapping cache (hr_shm_map.c), made at the first
   * mapping; it outlives the engine while received tensors use it. */
  hr__shm_cache *shm_cache;
  lookup *lookups; /* name lookups out on the pool (lookup_done) */
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static hr_tstamp now_of(hr_engine *e) {
  struct timespec ts;

  if (e->ops.now)
    return e->ops.now(e->loop_data);
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (hr_tstamp)ts.tv_sec * 1000000000ull + (hr_tstamp)ts.tv_nsec;
}

static void list_push(hr_conn **head, hr_conn *c) {
  c->prev = NULL;
  c->next = *head;
  if (*head)
    (*head)->prev = c;
  *head = c;
}

static void list_remove(hr_conn **head, hr_conn *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    *head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

static int fdmap_set(hr_engine *e, int fd, obj *o) {
  if (fd < 0)
    return HR_ERR_INVALID_ARGUMENT;
  if ((size_t)fd >= e->fdmap_len) {
    size_t n = e->fdmap_len ? e->fdmap_len : 64;
    obj **m;
    while (n <= (size_t)fd)
      n *= 2;
    m = hr__mem_realloc(&e->mem, e->fdmap, n * sizeof *m);
    if (!m)
      return HR_ERR_NOMEM;
    memset(m + e->fdmap_len, 0, (n - e->fdmap_len) * sizeof *m);
    e->fdmap = m;
    e->fdmap_len = n;
  }
  e->fdmap[fd] = o;
  return 0;
}

static obj *fdmap_get(hr_engine *e, int fd) {
  if (fd < 0 || (size_t)fd >= e->fdmap_len)
    return NULL;
  return e->fdmap[fd];
}

/* Asks the host to watch `fd` for `events`, when they changed. */
static int watch(hr_engine *e, int fd, int events, int *watching,
                 void **cookie) {
  int rv;

  if (*watching == events)
    return 0;
  rv = e->ops.watch(e->loop_data, fd, events, cookie);
  if (rv == 0)
    *watching = events;
  return rv;
}

static void conn_note(hr_conn *c, int status, const char *fmt, int err) {
  if (!c->close_status)
    c->close_status = status;
  if (!c->message[0] && fmt) {
    if (err)
      snprintf(c->message, sizeof c->message, "%s: %s", fmt, strerror(err));
    else
      snprintf(c->message, sizeof c->message, "%s", fmt);
  }
}

/* Arms a zero timer so that work marked outside an entry point runs on the
 * next loop turn. */
static void defer(hr_engine *e) {
  e->settle_pending = 1;
  if (e->depth == 0 && e->timer_at != 0) {
    if (e->ops.timer(e->loop_data, 0) == 0)
      e->timer_at = 0;
  }
}

/* ------------------------------------------------------------------------ */
/* Session callbacks                                                         */
/* ------------------------------------------------------------------------ */

static void job_run(hr__job *j) {
  job *jb = (job *)j;
  jb->w->run(jb->w);
}

/* Any thread (a device's completion): the job goes on the completion list
 * and the loop wakes through the eventfd. */
static void job_complete(hr_work *w, void *ctx) {
  job *jb = ctx;
  (void)w;
  hr__pool_post_done(jb->c->e->pool, &jb->base);
}

/* The worker pool, made on first use. */
static int engine_pool(hr_engine *e) {
  if (e->pool)
    return 0;
  return hr__pool_new(&e->pool, e->pool_threads, e->wake_fd, &e->mem);
}

static int cb_submit_work(hr_session *s, hr_work *w, void *ud) {
  hr_conn *c = ud;
  hr_engine *e = c->e;
  job *jb;
  int rv;

  (void)s;
  rv = engine_pool(e);
  if (rv)
    return rv;
  jb = hr__mem_calloc(&e->mem, 1, sizeof *jb);
  if (!jb)
    return HR_ERR_NOMEM;
  jb->base.run = job_run;
  jb->w = w;
  jb->c = c;
  if (w->start) {
    /* Device work: enqueued here, handed back by the device's completion
     * (job_complete), which writes the eventfd; no thread waits for it. */
    hr__pool_begin_async(e->pool);
    if (w->start(w, job_complete, jb) == 0) {
      c->work_inflight++;
      return 0;
    }
    hr__pool_end_async(e->pool);
  }
  rv = hr__pool_submit(e->pool, &jb->base);
  if (rv) {
    hr__mem_free(&e->mem, jb);
    return rv;
  }
  c->work_inflight++;
  return 0;
}

/* Tells the application its client connection (a lead with the lanes it
 * got) is up. */
static void lead_up(hr_conn *c) {
  if (c->notified_up)
    return;
  c->notified_up = 1;
  c->lanes_wanted = 0;
  if (c->cb) {
    c->e->in_user_cb++;
    c->cb(c, 0, c->ud);
    c->e->in_user_cb--;
  }
}

static void cb_established(hr_session *s, const hr_hello *peer, void *ud) {
  hr_conn *c = ud;

  (void)s;
  (void)peer;
  if (c->role != HR_ROLE_CLIENT)
    return;
  if (c->lead) {
    /* A lane joined: the next one may go (lanes join one at a time). */
    c->lead->lane_step = 1;
    return;
  }
  if (c->grp && c->lanes_wanted > 1) {
    c->lane_step = 1;
    return;
  }
  lead_up(c);
}

static void cb_error(hr_session *s, uint32_t wire_error, int sent,
                     const char *message, void *ud) {
  hr_conn *c = ud;

  (void)s;
  if (c->wire_error)
    return; /* the first error explains the close */
  c->wire_error = wire_error;
  c->wire_sent = sent;
  snprintf(c->message, sizeof c->message, "%s", message ? message : "");
  if (!c->close_status) {
    if (!sent)
      c->close_status = HR_ERR_REMOTE;
    else if (wire_error == HR_WIRE_TIMEOUT)
      c->close_status = HR_ERR_TIMEOUT;
    else
      c->close_status = HR_ERR_PROTO;
  }
}

static void cb_request(hr_session *s, const hr_transfer_record *rec,
                       void *ud) {
  hr_conn *c = ud;

  (void)s;
  if (c->e->cfg.on_request) {
    c->e->in_user_cb++;
    c->e->cfg.on_request(c, rec, c->e->cfg.user_data);
    c->e->in_user_cb--;
  }
}

/* on_conn: `ev` is HR_CONN_OPENED, _CLOSED or _REJECTED. */
static void conn_event(hr_conn *c, int ev) {
  hr_engine *e = c->e;

  if (ev == HR_CONN_OPENED)
    c->opened = 1;
  else if (ev == HR_CONN_CLOSED && !c->opened)
    return;
  if (e->cfg.on_conn) {
    e->in_user_cb++;
    e->cfg.on_conn(c, ev, e->cfg.user_data);
    e->in_user_cb--;
  }
}

static void cb_transfer(hr_session *s, const hr_transfer_record *rec,
                        void *ud) {
  hr_conn *c = ud;

  (void)s;
  if (c->e->cfg.on_transfer) {
    c->e->in_user_cb++;
    c->e->cfg.on_transfer(c, rec, c->e->cfg.user_data);
    c->e->in_user_cb--;
  }
}

/* ---- the provider trampolines (server): PUT byte accounting ---- */

static uint64_t desc_bytes(const hr_descriptor *d) {
  uint64_t sum = 0;
  unsigned k;

  for (k = 0; k < d->buffer_count && k < HR_MAX_BUFFERS; k++) {
    if (UINT64_MAX - sum < d->buffers[k].size_bytes)
      return UINT64_MAX;
    sum += d->buffers[k].size_bytes;
  }
  return sum;
}

static void put_release(hr_conn *c, uint32_t stream_id) {
  size_t i;

  for (i = 0; i < c->nputs; i++) {
    if (c->puts[i].stream_id == stream_id) {
      c->e->put_bytes -= c->puts[i].bytes;
      c->put_bytes -= c->puts[i].bytes;
      c->puts[i] = c->puts[--c->nputs];
      return;
    }
  }
}

static int tr_on_get(hr_session *s, hr_srv_get *g, void *ud) {
  hr_conn *c = ud;
  int rv;

  c->e->in_user_cb++;
  rv = c->user_prov.on_get(s, g, c->user_prov.user_data);
  c->e->in_user_cb--;
  return rv;
}

static void tr_on_get_cancel(hr_session *s, hr_srv_get *g, void *ud) {
  hr_conn *c = ud;

  c->e->in_user_cb++;
  c->user_prov.on_get_cancel(s, g, c->user_prov.user_data);
  c->e->in_user_cb--;
}

static int tr_on_put_begin(hr_session *s, const hr_put_info *info,
                           uint32_t *wire_error, void *ud) {
  hr_conn *c = ud;
  hr_engine *e = c->e;
  uint64_t bytes = desc_bytes(info->desc);
  uint64_t cap = e->cfg.max_inflight_bytes;
  int rv;

  uint64_t ccap = e->cfg.max_conn_inflight_bytes;

  /* Every cap is checked on the declared size, before the session
   * allocates the landing tensor: a PUT declaring 2^60 bytes costs
   * nothing. */
  if (bytes > e->cfg.max_put_bytes ||
      (cap && (bytes > cap || e->put_bytes > cap - bytes)) ||
      bytes > ccap || c->put_bytes > ccap - bytes) {
    *wire_error = HR_WIRE_RESOURCE_EXHAUSTED;
    return 0;
  }
  if (c->nputs == c->cap_puts) {
    size_t n = c->cap_puts ? c->cap_puts * 2 : 4;
    put_acct *p = hr__mem_realloc(&e->mem, c->puts, n * sizeof *p);
    if (!p) {
      *wire_error = HR_WIRE_RESOURCE_EXHAUSTED;
      return 0;
    }
    c->puts = p;
    c->cap_puts = n;
  }
  e->in_user_cb++;
  rv = c->user_prov.on_put_begin(s, info, wire_error, c->user_prov.user_data);
  e->in_user_cb--;
  if (rv == 0 && *wire_error == 0) {
    c->puts[c->nputs].stream_id = info->stream_id;
    c->puts[c->nputs].bytes = bytes;
    c->nputs++;
    e->put_bytes += bytes;
    c->put_bytes += bytes;
  }
  return rv;
}

static int tr_on_put_commit(hr_session *s, const hr_put_info *info,
                            hr_tensor *t, uint32_t *wire_error, void *ud) {
  hr_conn *c = ud;
  int rv;

  c->e->in_user_cb++;
  rv = c->user_prov.on_put_commit(s, info, t, wire_error,
                                  c->user_prov.user_data);
  c->e->in_user_cb--;
  put_release(c, info->stream_id);
  return rv;
}

static void tr_on_put_abort(hr_session *s, const hr_put_info *info, void *ud) {
  hr_conn *c = ud;

  if (c->user_prov.on_put_abort) {
    c->e->in_user_cb++;
    c->user_prov.on_put_abort(s, info, c->user_prov.user_data);
    c->e->in_user_cb--;
  }
  put_release(c, info->stream_id);
}

static int tr_on_list(hr_session *s, const hr_list_request *req,
                      int (*emit)(void *emit_ctx, const hr_list_entry *e),
                      void *emit_ctx, int *more, void *ud) {
  hr_conn *c = ud;
  int rv;

  c->e->in_user_cb++;
  rv = c->user_prov.on_list(s, req, emit, emit_ctx, more,
                            c->user_prov.user_data);
  c->e->in_user_cb--;
  return rv;
}

static int tr_on_hello(hr_session *s, const hr_hello *peer,
                       uint32_t *wire_error, void *ud) {
  hr_conn *c = ud;
  int rv;

  c->e->in_user_cb++;
  rv = c->user_prov.on_hello(s, peer, wire_error, c->user_prov.user_data);
  c->e->in_user_cb--;
  return rv;
}

static int tr_on_put_alloc(hr_session *s, const hr_descriptor *d,
                           unsigned min_alignment_log2, hr_tensor **out,
                           void *ud) {
  hr_conn *c = ud;
  int rv;

  c->e->in_user_cb++;
  rv = c->user_prov.on_put_alloc(s, d, min_alignment_log2, out,
                                 c->user_prov.user_data);
  c->e->in_user_cb--;
  return rv;
}

/* The provider a server session sees: the application's, with the
 * engine's accounting in between; NULL members stay NULL so that the
 * session advertises the same capabilities. */
static void wrap_provider(const hr_provider *up, hr_provider *out, hr_conn *c) {
  memset(out, 0, sizeof *out);
  out->size = sizeof *out;
  out->user_data = c;
  out->on_get = up->on_get ? tr_on_get : NULL;
  out->on_get_cancel = up->on_get_cancel ? tr_on_get_cancel : NULL;
  out->on_put_begin = up->on_put_begin ? tr_on_put_begin : NULL;
  out->on_put_commit = up->on_put_commit ? tr_on_put_commit : NULL;
  /* Abort is always hooked: the accounting needs it. */
  out->on_put_abort = up->on_put_begin ? tr_on_put_abort : NULL;
  out->on_list = up->on_list ? tr_on_list : NULL;
  out->on_hello = up->on_hello ? tr_on_hello : NULL;
  out->on_put_alloc = up->on_put_alloc ? tr_on_put_alloc : NULL;
}

static int cb_shm_map(hr_session *s, int fd, uint64_t offset, uint64_t len,
                      uint64_t align, hr_shm_mapping *out, char *why,
                      size_t why_len, void *ud) {
  hr_conn *c = ud;

  (void)s;
  if (!c->e->shm_cache && c->e->cfg.shm_map_cache >= 0)
    (void)hr__shm_cache_new(&c->e->shm_cache, c->e->wake_fd,
                            c->e->cfg.shm_map_cache,
                            c->e->cfg.shm_map_cache_bytes);
  if (c->e->shm_cache)
    return hr__shm_cache_map(c->e->shm_cache, fd, offset, len, align, out,
                             why, why_len);
  return hr__shm_map(fd, offset, len, align, c->e->wake_fd, out, why, why_len);
}

static int cb_shm_wake(hr_session *s, hr_shm_mapping *out, void *ud) {
  hr_conn *c = ud;

  (void)s;
  return hr__shm_wake_token(c->e->wake_fd, out);
}

static int cb_alloc_tensor(hr_session *s, const hr_descriptor *d,
                           unsigned min_alignment_log2, hr_tensor **out,
                           void *ud) {
  hr_conn *c = ud;
  hr_descriptor a = *d;
  uint64_t bytes = 0;
  unsigned k;

  (void)s;
  /* Each segment holds a descriptor for as long as the tensor lives:
   * small tensors (whose copy costs less than a mapping) stay ordinary
   * memory, so a store of many small keys does not run out of fds. */
  for (k = 0; k < d->buffer_count && k < HR_MAX_BUFFERS; k++)
    bytes += d->buffers[k].size_bytes;
  if (bytes < SHM_PUT_MIN_BYTES)
    return hr_tensor_alloc(out, d, min_alignment_log2, &c->e->mem);
  /* The segment places buffers by their own alignments: raise them to
   * the minimum asked for. */
  for (k = 0; k < a.buffer_count && k < HR_MAX_BUFFERS; k++)
    if (a.buffers[k].alignment_log2 < min_alignment_log2)
      a.buffers[k].alignment_log2 = (uint8_t)min_alignment_log2;
  if (hr_shm_tensor_alloc(out, &a, &c->e->mem) == 0)
    return 0;
  /* No memfd here (or out of descriptors): an ordinary buffer. */
  return hr_tensor_alloc(out, d, min_alignment_log2, &c->e->mem);
}

static void cb_fd_close(hr_session *s, int fd, void *ud) {
  (void)s;
  (void)ud;
  close(fd);
}

static size_t cb_io_fence(hr_session *s, int dir, void *ud);

/* `unix_sock`: the connection can carry descriptors, so the SHM data
 * plane's callbacks are set (unless the configuration turned it off). */
static void session_callbacks(hr_session_callbacks *cbs, const hr_engine *e,
                              int unix_sock) {
  memset(cbs, 0, sizeof *cbs);
  cbs->size = sizeof *cbs;
  cbs->submit_work = cb_submit_work;
  cbs->on_established = cb_established;
  cbs->on_error = cb_error;
  cbs->on_transfer = cb_transfer;
  cbs->on_request = cb_request;
  cbs->io_fence = cb_io_fence;
  if (unix_sock && !e->cfg.no_shm) {
    cbs->shm_map = cb_shm_map;
    cbs->fd_close = cb_fd_close;
    cbs->shm_wake = cb_shm_wake; /* device memory (hr_shm_dev.c) */
    /* What a local client PUTs lands in a shared segment, so that local
     * clients fetch it later without a copy.  Not for TCP PUTs: without
     * transparent huge pages for shmem (a common default), sending from
     * a memfd over TCP ran 3-5x slower than from heap memory here. */
    cbs->alloc_tensor = cb_alloc_tensor;
  }
}

/* Hands descriptors that came with `n` input bytes to the session. */
static int conn_fds(hr_conn *c, const int *fds, size_t nfds, ssize_t n,
                    hr_tstamp now) {
  size_t i;

  if (n > 0)
    return hr_session_recv_fds(c->s, fds, nfds, (size_t)n, now);
  for (i = 0; i < nfds; i++)
    close(fds[i]);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Bulk I/O on the worker pool                                               */
/* ------------------------------------------------------------------------ */

/* Whether a transfer of `len` bytes in direction `dir` goes to the pool:
 * large enough, a plain socket (an SSL object is used by one thread at a
 * time: TLS stays on the loop), not the engine's only connection (unless
 * bulk_offload_lone: one stream is bounded by one core, so a lone one
 * gains nothing from a worker and pays the handoffs), fewer jobs out
 * than bulk_offload_jobs allows, no job of that direction out, and the
 * last one did not stall on a slow peer. */
static int bulk_wanted(hr_conn *c, int dir, size_t len) {
  hr_engine *e = c->e;

  if (c->tls || c->state != CS_OPEN || (uint64_t)len < e->bulk_min)
    return 0;
  if (e->nconns < 2 && !e->cfg.bulk_offload_lone)
    return 0;
  /* As many jobs at once as the CPUs allow (bulk_offload_jobs); the
   * loop moves the rest itself. */
  if (!c->peer_host)
    c->peer_host = hr__bulk_fd_same_host(c->fd) ? 2 : 1;
  if (e->bulk_out >=
      (c->peer_host == 2 ? e->bulk_max_local : e->bulk_max_remote))
    return 0;
  return dir == HR_IO_TX ? !c->tx_out && !c->tx_slow
                         : !c->rx_out && !c->rx_slow;
}

/* The connection's job of `dir`, made on first use (NULL: no memory or
 * no eventfd; the loop moves the bytes itself). */
static hr__bulk *bulk_get(hr_conn *c, int dir) {
  hr_engine *e = c->e;
  hr__bulk **pb = dir == HR_IO_TX ? &c->btx : &c->brx;

  if (*pb)
    return *pb;
  if (engine_pool(e))
    return NULL;
  *pb = hr__mem_malloc(&e->mem, sizeof **pb);
  if (!*pb)
    return NULL;
  if (hr__bulk_init(*pb, c, e->pool)) {
    hr__mem_free(&e->mem, *pb);
    *pb = NULL;
  }
  return *pb;
}

/* Hands the job to the pool (the session holds the memory: io_hold).
 * Returns 1 when it is out, 0 when the loop must move the bytes. */
static int bulk_submit(hr_conn *c, hr__bulk *b, int dir, hr_tstamp now) {
  hr_engine *e = c->e;

  if (hr_session_io_hold(c->s, dir))
    return 0;
  hr__bulk_arm(b, dir, c->fd);
  if (hr__pool_submit(e->pool, &b->base)) {
    /* No thread could start: undo the hold by reporting nothing. */
    if (dir == HR_IO_TX)
      hr_session_consumed(c->s, 0, now);
    else
      hr_session_recv_placed(c->s, 0, now);
    return 0;
  }
  if (dir == HR_IO_TX)
    c->tx_out = 1;
  else
    c->rx_out = 1;
  c->work_inflight++;
  e->bulk_out++;
  return 1;
}

/* Writes the first `total` bytes of a pull's iovecs on the pool.  Returns
 * 1 when the job is out. */
static int bulk_tx(hr_conn *c, const hr_iov *hv, int n, size_t total,
                   hr_tstamp now) {
  hr__bulk *b = bulk_get(c, HR_IO_TX);
  size_t left = total;
  int i;

  if (!b || n > HR__BULK_IOV)
    return 0;
  for (i = 0; i < n && left; i++) {
    b->iov[i].iov_base = (void *)hv[i].base;
    b->iov[i].iov_len = hv[i].len < left ? hv[i].len : left;
    left -= b->iov[i].iov_len;
  }
  b->niov = i;
  b->total = total;
  return bulk_submit(c, b, HR_IO_TX, now);
}

/* Reads `len` bytes into `dst` on the pool.  Returns 1 when the job is
 * out. */
static int bulk_rx(hr_conn *c, void *dst, size_t len, hr_tstamp now) {
  hr__bulk *b = bulk_get(c, HR_IO_RX);

  if (!b)
    return 0;
  b->iov[0].iov_base = dst;
  b->iov[0].iov_len = len;
  b->niov = 1;
  b->total = len;
  return bulk_submit(c, b, HR_IO_RX, now);
}

/* Reports the first `n` bytes a TX job wrote to the tap. */
static void bulk_tap_tx(hr_conn *c, const hr__bulk *b, size_t n) {
  int i;

  for (i = 0; i < b->niov && n; i++) {
    size_t k = b->iov[i].iov_len < n ? b->iov[i].iov_len : n;
    c->tap_tx(b->iov[i].iov_base, k, c->tap_ud);
    n -= k;
  }
}

/* The session drops what a job points at (session.h, io_fence): stop it,
 * and count its bytes now, while the memory is still there. */
static size_t cb_io_fence(hr_session *s, int dir, void *ud) {
  hr_conn *c = ud;
  hr__bulk *b = dir == HR_IO_TX ? c->btx : c->brx;
  int out = dir == HR_IO_TX ? c->tx_out : c->rx_out;

  (void)s;
  if (!b || !out || b->fenced)
    return 0;
  hr__bulk_stop(b);
  b->fenced = 1;
  if (dir == HR_IO_TX) {
    c->tx_bytes += b->done;
    if (c->tap_tx)
      bulk_tap_tx(c, b, b->done);
    return b->done;
  }
  c->rx_bytes += b->done;
  if (c->tap_rx && b->done)
    c->tap_rx(b->iov[0].iov_base, b->done, c->tap_ud);
  return 0;
}

/* Stops the connection's jobs before its socket goes (their completions
 * still come back: the connection waits for them in `dead`). */
static void bulk_stop_all(hr_conn *c) {
  if (c->btx && c->tx_out)
    hr__bulk_stop(c->btx);
  if (c->brx && c->rx_out)
    hr__bulk_stop(c->brx);
}

/* A job came back (loop thread): its bytes go to the session, and the
 * loop takes the direction back. */
static void bulk_done(hr_conn *c, hr__bulk *b, hr_tstamp now) {
  int open = c->state == CS_OPEN;

  if (b->dir == HR_IO_TX) {
    c->tx_out = 0;
    if (!open)
      return;
    if (!b->fenced) {
      c->tx_bytes += b->done;
      if (c->tap_tx)
        bulk_tap_tx(c, b, b->done);
      hr_session_consumed(c->s, b->done, now);
    }
    if (b->err) {
      c->want_close = 1;
      conn_note(c, HR_ERR_IO, "send", b->err);
    } else if (b->done < b->total) {
      /* Stalled (or stopped): the loop waits for room itself. */
      c->out_blocked = 1;
      c->tx_slow = b->stalled;
    }
    return;
  }
  c->rx_out = 0;
  if (!open)
    return;
  if (b->done) {
    int rv;
    if (!b->fenced) {
      c->rx_bytes += b->done;
      if (c->tap_rx)
        c->tap_rx(b->iov[0].iov_base, b->done, c->tap_ud);
    }
    rv = hr_session_recv_placed(c->s, b->done, now);
    if (hr_err_is_fatal(rv)) {
      c->want_close = 1;
      conn_note(c, rv, "session failed", 0);
      return;
    }
  }
  if (b->eof) {
    c->peer_eof = 1;
    c->want_close = 1;
    conn_note(c, HR_ERR_CLOSED, NULL, 0);
  } else if (b->err) {
    c->want_close = 1;
    conn_note(c, HR_ERR_IO, "recv", b->err);
  } else if (b->stalled) {
    c->rx_slow = 1;
  }
}

/* ------------------------------------------------------------------------ */
/* Connection I/O                                                            */
/* ------------------------------------------------------------------------ */

/* The connection's transport: TLS (hr_tls.c) or the plain socket.  Both
 * behave like recv() and sendmsg(). */
/* A plain socket's reads also take SCM_RIGHTS descriptors (the SHM data
 * plane, on Unix sockets); TLS never carries any. */
static ssize_t conn_recv(hr_conn *c, void *buf, size_t len, int draining,
                         int *fds, size_t *nfds) {
  *nfds = 0;
  if (c->tls)
    return hr__tls_recv(c->tls, buf, len, draining);
  return hr__shm_recv(c->fd, buf, len, fds, nfds);
}

/* `fd`: an SHM descriptor to attach to the write's first byte (or -1). */
static ssize_t conn_sendv(hr_conn *c, struct msghdr *mh, int fd) {
  if (c->tls)
    return hr__tls_sendv(c->tls, mh->msg_iov, (int)mh->msg_iovlen);
  return hr__shm_sendmsg(c->fd, mh, fd, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Reads what the socket holds, up to the byte budget.  Returns 0 or a
 * fatal error; socket errors and EOF mark the connection for closing. */
static int conn_read(hr_conn *c, hr_tstamp now) {
  hr_engine *e = c->e;
  size_t budget = e->cfg.io_budget;
  int rv, first = 1;

  if (c->rx_out)
    return 0; /* a worker reads this socket */
  /* Bytes TLS already holds are read past the budget: no readiness of
   * the socket would ever report them. */
  while ((budget > 0 || (c->tls && hr__tls_pending(c->tls))) &&
         hr_session_want_read(c->s) && !hr_session_recv_paused(c->s)) {
    void *dst;
    size_t want, nfds = 0;
    ssize_t n;
    int fds[HR_SHM_MAX_FDS];

    /* Each read has its own time: what one read brings (thousands of
     * small messages) may take long to process, and the time the batch
     * began would make a peer that keeps sending look stalled to the
     * read timeout once the batch ends. */
    if (!first)
      now = now_of(e);
    first = 0;
    if (hr_session_recv_target(c->s, &dst, &want)) {
      /* Bulk: straight into the tensor (past the budget only what TLS
       * holds: never a zero-length read, that would look like EOF). */
      if (budget && want > budget)
        want = budget;
      /* A large piece goes to a worker; the loop reads other sockets. */
      if (bulk_wanted(c, HR_IO_RX, want) && bulk_rx(c, dst, want, now))
        return 0;
      n = conn_recv(c, dst, want, budget == 0, fds, &nfds);
      if (n > 0 && (size_t)n == want)
        c->rx_slow = 0; /* the peer keeps up again */
      if (nfds && hr_err_is_fatal(rv = conn_fds(c, fds, nfds, n, now)))
        return rv;
      if (n > 0) {
        c->rx_bytes += (uint64_t)n;
        if (c->tap_rx)
          c->tap_rx(dst, (size_t)n, c->tap_ud);
        rv = hr_session_recv_placed(c->s, (size_t)n, now);
        if (hr_err_is_fatal(rv))
          return rv;
      }
    } else {
      int64_t took;

      want = STAGING_SIZE;
      n = conn_recv(c, e->staging, want, budget == 0, fds, &nfds);
      if (nfds && hr_err_is_fatal(rv = conn_fds(c, fds, nfds, n, now)))
        return rv;
      if (n > 0 && !c->tls && !c->rx_bytes && c->role == HR_ROLE_CLIENT &&
          hr__tls_sniff(e->staging, (size_t)n)) {
        c->want_close = 1;
        conn_note(c, HR_ERR_IO,
                  "the server speaks TLS: connect with hurrays://", 0);
        return 0;
      }
      if (n > 0) {
        c->rx_bytes += (uint64_t)n;
        if (c->tap_rx)
          c->tap_rx(e->staging, (size_t)n, c->tap_ud);
        took = hr_session_recv(c->s, e->staging, (size_t)n, now);
        if (took < 0)
          return (int)took;
        /* The session takes everything it is given (session.h). */
        if ((size_t)took != (size_t)n)
          return HR_ERR_INTERNAL;
      }
    }
    if (n == 0) {
      c->peer_eof = 1;
      c->want_close = 1;
      /* A TLS server drops a plain client without a word. */
      conn_note(c, HR_ERR_CLOSED,
                !c->tls && !c->rx_bytes && c->role == HR_ROLE_CLIENT
                    ? "the server closed the connection without answering "
                      "(a TLS server? then use hurrays://)"
                    : NULL,
                0);
      return 0;
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        c->want_close = 1;
        conn_note(c, HR_ERR_IO, "recv", errno);
      }
      return 0;
    }
    budget -= (size_t)n < budget ? (size_t)n : budget;
    /* A short read means the socket is empty: skip the EAGAIN call (not
     * with TLS, which returns the records its buffer holds whole). */
    if ((size_t)n < want && !c->tls)
      break;
  }
  return 0;
}

/* Writes the session's output, up to the byte budget.  Sets out_blocked
 * when the socket is full. */
static void conn_flush(hr_conn *c, hr_tstamp now) {
  size_t budget = c->e->cfg.io_budget;
  hr_iov hv[IOV_BATCH];
  struct iovec iov[IOV_BATCH];
  struct msghdr mh;

  if (c->tx_out)
    return; /* a worker writes this socket */
  while (budget > 0) {
    int n = hr_session_pull(c->s, hv, IOV_BATCH, now), i;
    size_t total = 0;
    ssize_t w;

    if (n <= 0)
      break;
    for (i = 0; i < n; i++) {
      iov[i].iov_base = (void *)hv[i].base;
      iov[i].iov_len = hv[i].len;
      total += hv[i].len;
    }
    /* Tensor frames go to a worker, at most the byte budget of a turn;
     * the loop serves other sockets.  An SHM descriptor (Unix sockets) is
     * sent by the loop. */
    if (bulk_wanted(c, HR_IO_TX, total < budget ? total : budget) &&
        hr_session_pull_fd(c->s) < 0 &&
        bulk_tx(c, hv, n, total < budget ? total : budget, now))
      return;
    /* sendmsg() is writev() with MSG_NOSIGNAL: a peer that vanished must
     * give EPIPE, not kill the host with SIGPIPE. */
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)n;
    do {
      /* An SHM descriptor rides on the first byte of this write. */
      w = conn_sendv(c, &mh, hr_session_pull_fd(c->s));
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
      hr_session_consumed(c->s, 0, now);
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c->out_blocked = 1;
      } else {
        c->want_close = 1;
        conn_note(c, HR_ERR_IO, "send", errno);
      }
      return;
    }
    if (c->tap_tx) {
      size_t left = (size_t)w;
      for (i = 0; i < n && left; i++) {
        size_t k = hv[i].len < left ? hv[i].len : left;
        c->tap_tx(hv[i].base, k, c->tap_ud);
        left -= k;
      }
    }
    c->tx_bytes += (uint64_t)w;
    hr_session_consumed(c->s, (size_t)w, now);
    if ((size_t)w < total) {
      c->out_blocked = 1;
      return;
    }
    c->tx_slow = 0; /* the peer keeps up again */
    budget -= (size_t)w < budget ? (size_t)w : budget;
  }
  /* Out of budget with more to send: yield to the other connections and
   * come back on the next writability report (immediate, the socket
   * still has room), never from settle() (that would skip the turn). */
  if (budget == 0 && hr_session_want_write(c->s))
    c->out_blocked = 1;
}

/* The events a live connection needs watched. */
static int conn_events(hr_conn *c) {
  int ev = 0;

  switch (c->state) {
  case CS_CONNECTING: return HR_POLL_OUT;
  case CS_OPEN:
    /* A session waiting for its device (recv_paused) leaves the input
     * in the socket: backpressure on the peer.  A direction a worker has
     * is not watched (its readiness is the worker's). */
    if (hr_session_want_read(c->s) && !c->peer_eof &&
        !hr_session_recv_paused(c->s) && !c->rx_out)
      ev |= HR_POLL_IN;
    if (c->out_blocked && !c->tx_out)
      ev |= HR_POLL_OUT;
    return c->tls ? hr__tls_events(c->tls, ev) : ev;
  case CS_LINGER:
    if (c->pre_len)
      ev |= HR_POLL_OUT;
    if (!c->peer_eof)
      ev |= HR_POLL_IN;
    return ev;
  default: return 0;
  }
}

/* Frees the addresses a client connection still had to try. */
static void conn_ais_free(hr_conn *c) {
  if (c->ais)
    freeaddrinfo(c->ais);
  c->ais = NULL;
  c->ai_rest = NULL;
}

static void conn_free(hr_conn *c) {
  hr_engine *e = c->e;

  /* A lookup still out is freed when it comes back (lookup_done). */
  if (c->lookup)
    c->lookup->j.c = NULL;
  conn_ais_free(c);
  if (c->btx) {
    hr__bulk_fini(c->btx);
    hr__mem_free(&e->mem, c->btx);
  }
  if (c->brx) {
    hr__bulk_fini(c->brx);
    hr__mem_free(&e->mem, c->brx);
  }
  hr_session_del(c->s);
  hr_group_del(c->grp);
  hr__mem_free(&e->mem, c->puts);
  hr__mem_free(&e->mem, c);
}

/* Closes the socket and frees the connection (or parks it until its work
 * items are back). */
static void conn_close_socket(hr_conn *c) {
  hr_engine *e = c->e;

  if (c->fd >= 0) {
    /* No worker may touch the descriptor once it is closed (its number
     * could be reused at once). */
    bulk_stop_all(c);
    if (c->watching)
      e->ops.watch(e->loop_data, c->fd, 0, &c->cookie);
    c->watching = 0;
    fdmap_set(e, c->fd, NULL);
    hr__tls_del(c->tls);
    c->tls = NULL;
    close(c->fd);
    c->fd = -1;
  }
  if (c->state == CS_LINGER) {
    list_remove(&e->lingering, c);
    if (c->is_reject)
      e->nrejecting--;
  }
  c->state = CS_DEAD;
  /* Its work, and a PUT callback waiting for the fabric to release the
   * tensor (decision 78), end before the session goes. */
  if (c->work_inflight || hr_session_callbacks_parked(c->s))
    list_push(&e->dead, c);
  else
    conn_free(c);
}

/* Frees the dead connections whose work is back and whose session has no
 * callback parked any more. */
static void dead_reap(hr_engine *e) {
  hr_conn *c, *next;

  for (c = e->dead; c; c = next) {
    next = c->next;
    if (!c->work_inflight && !hr_session_callbacks_parked(c->s)) {
      list_remove(&e->dead, c);
      conn_free(c);
    }
  }
}

/* Turns a finished connection into a lingering socket (or closes it when
 * the peer already closed its side). */
static void conn_start_linger(hr_conn *c, hr_tstamp now) {
  hr_engine *e = c->e;

  c->state = CS_LINGER;
  list_push(&e->lingering, c);
  if (c->peer_eof || c->fd < 0) {
    conn_close_socket(c);
    return;
  }
  c->linger_until = now + LINGER_NS;
  if (!c->pre_len) {
    if (c->tls)
      hr__tls_close_notify(c->tls);
    shutdown(c->fd, SHUT_WR);
    c->shut_wr = 1;
  }
  if (watch(e, c->fd, conn_events(c), &c->watching, &c->cookie) != 0)
    conn_close_socket(c);
}

/* Ends a CONNECTING or OPEN connection: the session's streams complete,
 * the client hears about it, the socket lingers. */
/* Unlinks a lane from its lead.  A lane that fails while the lead still
 * opens lanes ends the opening: the session goes on with the lanes it
 * has. */
static void lane_detach(hr_conn *c) {
  hr_conn *lead = c->lead, **pp;

  if (!lead)
    return;
  for (pp = &lead->lanes; *pp; pp = &(*pp)->lane_next)
    if (*pp == c) {
      *pp = c->lane_next;
      break;
    }
  c->lead = NULL;
  c->lane_next = NULL;
  if (!lead->notified_up && lead->state == CS_OPEN)
    lead_up(lead);
}

/* The lead goes: its lanes serve nothing any more. */
static void lanes_close(hr_conn *lead) {
  hr_conn *l;

  while ((l = lead->lanes)) {
    lead->lanes = l->lane_next;
    l->lead = NULL;
    l->lane_next = NULL;
    l->want_close = 1;
    conn_note(l, HR_ERR_CLOSED, "lane 0 of the session closed", 0);
  }
}

static void conn_teardown(hr_conn *c, hr_tstamp now) {
  hr_engine *e = c->e;
  size_t i;
  int status = c->close_status ? c->close_status : HR_ERR_CLOSED;

  /* The lingering socket is the loop's alone; the session's fences
   * (terminate below) count what the jobs moved. */
  bulk_stop_all(c);
  lanes_close(c);
  lane_detach(c);
  list_remove(&e->conns, c);
  e->nconns--;
  if (c->role == HR_ROLE_SERVER)
    e->nserver--;
  /* From here on hr_conn_close() and the settle loop leave it alone. */
  c->state = CS_LINGER;
  hr_session_terminate(c->s, now);
  for (i = 0; i < c->nputs; i++)
    e->put_bytes -= c->puts[i].bytes;
  c->nputs = 0;
  if (c->role == HR_ROLE_CLIENT && c->cb) {
    e->in_user_cb++;
    c->cb(c, status, c->ud);
    e->in_user_cb--;
  }
  conn_event(c, HR_CONN_CLOSED);
  conn_start_linger(c, now);
}

/* Output still to send while lingering (a rejection's ERROR). */
static void linger_io(hr_conn *c, int revents, hr_tstamp now) {
  hr_engine *e = c->e;
  uint8_t sink[4096];
  ssize_t n;

  (void)now;
  if (c->pre_len) {
    n = send(c->fd, c->pre + c->pre_off, c->pre_len, MSG_NOSIGNAL);
    if (n > 0) {
      c->pre_off += (size_t)n;
      c->pre_len -= (size_t)n;
      c->tx_bytes += (uint64_t)n;
    } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
               errno != EINTR) {
      conn_close_socket(c);
      return;
    }
    if (!c->pre_len && !c->shut_wr) {
      shutdown(c->fd, SHUT_WR);
      c->shut_wr = 1;
    }
  }
  if (revents & HR_POLL_IN) {
    /* Discard what the peer still sends until it closes. */
    for (;;) {
      n = recv(c->fd, sink, sizeof sink, 0);
      if (n > 0)
        continue;
      if (n < 0 && errno == EINTR)
        continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        conn_close_socket(c);
        return;
      }
      break;
    }
  }
  if (watch(e, c->fd, conn_events(c), &c->watching, &c->cookie) != 0)
    conn_close_socket(c);
}

/* Notes the peer's credentials of a Unix socket (nothing for TCP). */
static void conn_peer(hr_conn *c) {
  hr_peer_cred *p = &c->cred;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;

  c->has_cred = hr__sock_peer_cred(c->fd, &p->pid, &p->uid, &p->gid) == 0;
  hr__sock_peer_name(c->fd, c->peer, sizeof c->peer);
  /* The RDMA data plane checks the peer's FABRIC_ADDRESS against it. */
  if (c->e->fabric && getpeername(c->fd, (struct sockaddr *)&ss, &sl) == 0 &&
      (ss.ss_family == AF_INET || ss.ss_family == AF_INET6))
    hr_session_set_peer_addr(c->s, &ss, sl);
}

static int conn_socket(hr_engine *e, const hr__addr *a,
                       const struct addrinfo *ai, hr_conn *c);

/* The connect of client connection `c` failed with `err` (reported by
 * the socket's writability): it goes on with the next address its host
 * name gave, or, with none left, fails with that last error, which names
 * the address. */
static void conn_next_addr(hr_conn *c, int err) {
  hr_engine *e = c->e;
  char name[HR_SOCK_PEER_MAX], what[HR_SOCK_PEER_MAX + 16];
  int rv;

  name[0] = 0;
  if (c->lane_salen)
    hr__sock_addr_name(&c->lane_sa, name, sizeof name);
  snprintf(what, sizeof what, name[0] ? "connect to %s" : "connect", name);
  if (!c->ai_rest) {
    c->want_close = 1;
    conn_note(c, HR_ERR_IO, what, err);
    return;
  }
  /* The socket that failed goes; the connection stays CONNECTING, its
   * session and its deadline untouched (the handshake timeout bounds all
   * the attempts together). */
  if (c->watching)
    e->ops.watch(e->loop_data, c->fd, 0, &c->cookie);
  c->watching = 0;
  fdmap_set(e, c->fd, NULL);
  hr__tls_del(c->tls);
  c->tls = NULL;
  close(c->fd);
  c->fd = -1;
  c->lane_salen = 0;
  c->message[0] = 0;
  rv = conn_socket(e, &c->addr, c->ai_rest, c);
  if (rv) {
    /* No address left took the connect() call: conn_socket() said why
     * in c->message. */
    c->want_close = 1;
    conn_note(c, rv, what, err);
  }
}

/* Readiness of a live connection. */
static int conn_io(hr_conn *c, int revents, hr_tstamp now) {
  int rv;

  if (c->state == CS_CONNECTING) {
    int err = hr__sock_connect_result(c->fd);
    if (err) {
      conn_next_addr(c, err);
      return 0;
    }
    conn_ais_free(c);
    c->state = CS_OPEN;
    hr__sock_tune(c->fd, c->e->cfg.socket_buffer);
    conn_peer(c);
    conn_event(c, HR_CONN_OPENED);
    revents &= ~HR_POLL_IN; /* nothing to read yet */
  }
  if (c->tls)
    revents = hr__tls_revents(c->tls, revents);
  if (revents & HR_POLL_IN) {
    rv = conn_read(c, now);
    if (rv)
      return rv;
  }
  if (revents & HR_POLL_OUT)
    c->out_blocked = 0;
  if (!c->want_close && !c->out_blocked && hr_session_want_write(c->s))
    conn_flush(c, now);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Settle: the end of every entry point                                      */
/* ------------------------------------------------------------------------ */

/* Runs the fabric when it is due (completions, pieces waiting for room):
 * its events may give sessions output.  Returns 1 when it ran. */
static int fabric_due(hr_engine *e, hr_tstamp now) {
#ifdef HR_HAVE_FABRIC
  if (e->fabric && hr_fabric_get_expiry(e->fabric) <= now) {
    hr_fabric_progress(e->fabric, now);
    return 1;
  }
#else
  (void)e;
  (void)now;
#endif
  return 0;
}

static void update_timer(hr_engine *e, hr_tstamp now) {
  hr_tstamp next = HR_TSTAMP_NEVER, t, fab = HR_TSTAMP_NEVER;
  hr_conn *c;
  int64_t ms;

  if (e->settle_pending)
    next = now;
#ifdef HR_HAVE_FABRIC
  if (e->fabric) {
    fab = hr_fabric_get_expiry(e->fabric);
    if (fab < next)
      next = fab;
  }
#endif
  for (c = e->conns; c; c = c->next) {
    t = hr_session_get_expiry(c->s);
    if (t < next)
      next = t;
  }
  for (c = e->lingering; c; c = c->next)
    if (c->linger_until < next)
      next = c->linger_until;
  if (e->accept_paused && e->accept_resume < next)
    next = e->accept_resume;
  if (e->closing && !e->closed_notified && e->drain_deadline < next)
    next = e->drain_deadline;
  if (next == e->timer_at)
    return;
  if (e->ops.timer_ns) {
    /* Nanoseconds: a fabric's short poll deadline is slept, not spun. */
    int64_t ns = next == HR_TSTAMP_NEVER ? -1
                 : next <= now           ? 0
                 : next - now > (hr_tstamp)INT64_MAX
                     ? INT64_MAX
                     : (int64_t)(next - now);
    if (e->ops.timer_ns(e->loop_data, ns) == 0)
      e->timer_at = next;
    return;
  }
  if (next == HR_TSTAMP_NEVER) {
    ms = -1;
  } else if (next <= now || (next == fab && next - now < 1000000u)) {
    /* A fabric without a wait fd polls every few microseconds while a
     * transfer runs: a millisecond timer would cap its bandwidth, so the
     * next loop turn polls instead. */
    ms = 0;
  } else {
    uint64_t d = (next - now + 999999u) / 1000000u;
    ms = d > INT32_MAX ? INT32_MAX : (int64_t)d;
  }
  if (e->ops.timer(e->loop_data, ms) == 0)
    e->timer_at = next;
}

static void listeners_watch(hr_engine *e, int events) {
  hr_listener *l;

  for (l = e->listeners; l; l = l->next)
    if (!l->closed)
      watch(e, l->fd, events, &l->watching, &l->cookie);
}

static void listener_free(hr_engine *e, hr_listener *l) {
  if (l->fd >= 0) {
    if (l->watching)
      e->ops.watch(e->loop_data, l->fd, 0, &l->cookie);
    fdmap_set(e, l->fd, NULL);
    close(l->fd);
    l->fd = -1;
  }
  /* The name goes with the listener; connections handed over and not
   * taken yet are closed with the hand-over socket above. */
  if (l->inames)
    hr__inproc_names_unbind(l->inames, l->iname);
  /* The socket file goes with the listener: a later server must not find
   * it and take it for a live one. */
  if (l->path[0])
    unlink(l->path);
  hr__mem_free(&e->mem, l);
}

/* Frees listeners marked closed (they may be closed from callbacks that
 * run inside their own accept loop). */
static void reap_listeners(hr_engine *e) {
  hr_listener **pp = &e->listeners, *l;

  while ((l = *pp)) {
    if (l->closed) {
      *pp = l->next;
      listener_free(e, l);
    } else {
      pp = &l->next;
    }
  }
}

static int conn_start(hr_engine *e, const hr__addr *a,
                      const struct addrinfo *ai, hr_conn *c);
static void lookup_done(hr_engine *e, lookup *lk);
static void lookups_free(hr_engine *e);

/* A new connection of `e` on socket `fd` (-1: none yet) in `state`, yet
 * in no list nor the fd map; NULL when out of memory. */
static hr_conn *conn_alloc(hr_engine *e, int fd, int role, int state) {
  hr_conn *c = hr__mem_calloc(&e->mem, 1, sizeof *c);

  if (!c)
    return NULL;
  c->o.kind = OBJ_CONN;
  c->e = e;
  c->fd = fd;
  c->role = role;
  c->state = state;
  return c;
}

/* Frees a connection conn_alloc() made that never got listed, with its
 * group handle and session when it got them (its socket is the
 * caller's). */
static void conn_discard(hr_conn *c) {
  hr_engine *e = c->e;

  hr_group_del(c->grp);
  hr_session_del(c->s);
  hr__mem_free(&e->mem, c);
}

/* The lead's address as a one-entry list for its lanes (NULL: a Unix
 * path). */
static const struct addrinfo *lane_ai(hr_conn *lead, struct addrinfo *ai) {
  if (!lead->lane_salen)
    return NULL;
  memset(ai, 0, sizeof *ai);
  ai->ai_family = lead->lane_sa.ss_family;
  ai->ai_socktype = SOCK_STREAM;
  ai->ai_addrlen = lead->lane_salen;
  ai->ai_addr = (struct sockaddr *)&lead->lane_sa;
  return ai;
}

/* Opens the lead's next lane, or tells the application the lead is up
 * when no lane is left to open (all there, the server keeps no
 * sessions, the engine closes). */
static void lane_next(hr_conn *lead, hr_tstamp now) {
  hr_engine *e = lead->e;
  hr_conn *c;
  struct addrinfo ai;
  int rv;

  if (lead->notified_up)
    return;
  if (e->closing || hr_group_lanes(lead->grp) >= lead->lanes_wanted) {
    lead_up(lead);
    return;
  }
  c = conn_alloc(e, -1, HR_ROLE_CLIENT, CS_CONNECTING);
  if (!c) {
    lead_up(lead);
    return;
  }
  rv = hr_group_add_lane(lead->grp, c, now, &c->s);
  if (rv == 0)
    rv = conn_start(e, &lead->addr, lane_ai(lead, &ai), c);
  if (rv) {
    /* HR_ERR_UNSUPPORTED: the server sent no SESSION_TOKEN. */
    conn_discard(c);
    lead_up(lead);
    return;
  }
  c->lead = lead;
  c->lane_next = lead->lanes;
  lead->lanes = c;
}

static void settle(hr_engine *e) {
  hr_tstamp now;
  hr_conn *c, *next;
  int pass, busy;

  e->depth++;
  now = now_of(e);
  e->settle_pending = 0;
  for (pass = 0; pass < SETTLE_PASSES; pass++) {
    busy = 0;
    if (e->closing && !e->shutdown_sent) {
      e->shutdown_sent = 1;
      for (c = e->conns; c; c = c->next)
        c->graceful_req = 1;
    }
    for (c = e->conns; c; c = next) {
      next = c->next;
      if (c->state == CS_CONNECTING) {
        /* The session gave up while the TCP connect still hangs (its
         * handshake timeout covers the connect): it can no longer read. */
        if (!hr_session_want_read(c->s) && !c->want_close) {
          c->want_close = 1;
          conn_note(c, HR_ERR_TIMEOUT, "connect timed out", 0);
        }
        if (c->want_close || c->graceful_req) {
          conn_note(c, HR_ERR_CLOSED, NULL, 0);
          conn_teardown(c, now);
          busy = 1;
        }
        continue;
      }
      if (c->lane_step && !c->want_close) {
        c->lane_step = 0;
        lane_next(c, now);
        busy = 1;
      }
      if (c->graceful_req && !c->graceful_done && !c->want_close) {
        c->graceful_done = 1;
        if (hr_err_is_fatal(hr_session_shutdown(c->s, now)))
          c->want_close = 1;
      }
      if (!c->want_close && !c->out_blocked && hr_session_want_write(c->s))
        conn_flush(c, now);
      if (!c->want_close) {
        int r = hr_session_want_read(c->s), w = hr_session_want_write(c->s);
        /* nghttp2's rule: both 0 means done (after a shutdown the session
         * drops both once its streams finished and the GOAWAY is out). */
        if ((!r && !w) || c->peer_eof)
          c->want_close = 1;
        /* A session that gave up (a timeout) before the TLS handshake
         * finished has nothing it could still send. */
        if (!r && c->tls && !hr__tls_ready(c->tls))
          c->want_close = 1;
      }
      if (c->want_close) {
        conn_teardown(c, now);
        busy = 1;
        continue;
      }
      if (watch(e, c->fd, conn_events(c), &c->watching, &c->cookie) != 0) {
        c->want_close = 1;
        conn_note(c, HR_ERR_IO, "the event loop refused to watch the socket",
                  0);
        busy = 1;
      }
    }
    if (fabric_due(e, now_of(e)))
      busy = 1;
    if (e->dead)
      dead_reap(e);
    if (!busy)
      break;
  }
  if (pass == SETTLE_PASSES)
    e->settle_pending = 1; /* more next turn */
  reap_listeners(e);
  e->depth--;
  if (e->closing && !e->closed_notified && !e->conns && !e->lingering &&
      !e->dead) {
    e->closed_notified = 1;
    if (e->on_closed) {
      e->depth++;
      e->in_user_cb++;
      e->on_closed(e, e->closed_ud);
      e->in_user_cb--;
      e->depth--;
    }
  }
  update_timer(e, now_of(e));
}

/* ------------------------------------------------------------------------ */
/* Accepting                                                                 */
/* ------------------------------------------------------------------------ */

/* Builds the ERROR RESOURCE_EXHAUSTED a refused connection gets. */
static size_t encode_reject(uint8_t *out, size_t cap) {
  static const char text[] = "server at its connection limit; retry later";
  hr_msg m;
  int64_t n;

  memset(&m, 0, sizeof m);
  m.hdr.type = HR_MSG_ERROR;
  m.hdr.stream_id = 0;
  m.u.error.code = HR_WIRE_RESOURCE_EXHAUSTED;
  m.u.error.message = (const uint8_t *)text;
  m.u.error.message_len = (uint16_t)(sizeof text - 1);
  n = hr_wire_encode(&m, out, cap);
  return n > 0 ? (size_t)n : 0;
}

static void reject(hr_engine *e, int fd, hr_tstamp now) {
  hr_conn *c;

  if (e->nrejecting >= MAX_REJECTING) {
    close(fd);
    return;
  }
  c = conn_alloc(e, fd, HR_ROLE_SERVER, CS_LINGER);
  if (!c) {
    close(fd);
    return;
  }
  c->is_reject = 1;
  c->pre_len = encode_reject(c->pre, sizeof c->pre);
  if (fdmap_set(e, fd, &c->o) != 0) {
    close(fd);
    conn_discard(c);
    return;
  }
  e->nrejecting++;
  list_push(&e->lingering, c);
  c->linger_until = now + LINGER_NS;
  hr__sock_peer_name(fd, c->peer, sizeof c->peer);
  conn_event(c, HR_CONN_REJECTED);
  /* Try the write at once; the watch covers the rest. */
  linger_io(c, 0, now);
}

static int conn_new_server(hr_engine *e, hr_listener *l, int fd,
                           hr_tstamp now) {
  hr_session_callbacks cbs;
  hr_provider prov;
  hr_conn *c;
  int rv;

  c = conn_alloc(e, fd, HR_ROLE_SERVER, CS_OPEN);
  if (!c)
    return HR_ERR_NOMEM;
  c->user_prov = l->prov;
  wrap_provider(&l->prov, &prov, c);
  session_callbacks(&cbs, e, hr__sock_is_unix(fd));
  rv = hr_session_new(&c->s, HR_ROLE_SERVER, &e->cfg.session, &cbs, &prov, c,
                      now, &e->mem);
  if (rv)
    goto fail;
  /* Clients may join this session from other connections, or start a
   * session others join. */
  if (e->reg)
    hr_session_set_registry(c->s, e->reg);
  rv = fdmap_set(e, fd, &c->o);
  if (rv)
    goto fail;
  hr__sock_tune(fd, e->cfg.socket_buffer);
  if (l->tls) {
    rv = hr__tls_new(&c->tls, e->tls_srv, fd, NULL, c->message,
                     sizeof c->message);
    if (rv) {
      fdmap_set(e, fd, NULL);
      goto fail;
    }
  }
  /* Before the first read: the HELLO hook may ask for them. */
  conn_peer(c);
  list_push(&e->conns, c);
  e->nconns++;
  e->nserver++;
  conn_event(c, HR_CONN_OPENED);
  /* The CLIENT_HELLO usually arrived with the connection: read it now. */
  rv = conn_io(c, HR_POLL_IN, now);
  if (rv) {
    c->want_close = 1;
    conn_note(c, rv, "session failed", 0);
  }
  return 0;
fail:
  conn_discard(c);
  return rv;
}

static void listener_io(hr_listener *l, hr_tstamp now) {
  hr_engine *e = l->e;
  int i, fd, rv;

  for (i = 0; i < ACCEPT_BATCH && !l->closed; i++) {
    if (l->inames) {
      fd = hr__inproc_accept(l->fd);
      if (fd == HR_ERR_WOULDBLOCK)
        break;
      if (fd < 0)
        errno = EMFILE; /* no descriptor came: pause as below */
    } else {
      fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        /* Out of descriptors: stop watching the listeners for a moment
         * instead of spinning on a readiness we cannot serve. */
        e->accept_paused = 1;
        e->accept_resume = now + ACCEPT_PAUSE_NS;
        listeners_watch(e, 0);
      }
      break;
    }
    if (e->closing) {
      close(fd);
      continue;
    }
    if (e->nserver >= e->cfg.max_connections) {
      /* A TLS client could not read a plain ERROR: it just sees the
       * close. */
      if (l->tls)
        close(fd);
      else
        reject(e, fd, now);
      continue;
    }
    rv = conn_new_server(e, l, fd, now);
    if (rv)
      close(fd); /* out of memory for this one: the next may fit */
  }
}

/* ------------------------------------------------------------------------ */
/* Worker completions                                                        */
/* ------------------------------------------------------------------------ */

/* Completes the pool's finished jobs. */
static void reap_jobs(hr_engine *e, hr_tstamp now) {
  hr__job *list, *j;

  if (e->pool) {
    list = hr__pool_take_done(e->pool);
    while (list) {
      job *jb = (job *)list;
      hr_conn *c;
      j = list;
      list = list->next;
      if (hr__bulk_is(j)) {
        hr__bulk *b = (hr__bulk *)j;
        c = b->owner;
        c->work_inflight--;
        e->bulk_out--;
        bulk_done(c, b, now);
        if (c->state == CS_DEAD && c->work_inflight == 0 &&
            !hr_session_callbacks_parked(c->s)) {
          list_remove(&e->dead, c);
          conn_free(c);
        }
        continue;
      }
      if (!jb->w) {
        lookup_done(e, (lookup *)jb);
        continue;
      }
      c = jb->c;
      c->work_inflight--;
      /* The session is alive until its work is back, even after its
       * connection ended: it frees the work item itself. */
      hr_session_work_done(c->s, jb->w, now);
      hr__mem_free(&e->mem, j);
      /* A session that paused its input may take it again: what TLS
       * already decrypted is never reported by the socket. */
      if (c->state == CS_OPEN && c->tls && hr__tls_pending(c->tls) &&
          !hr_session_recv_paused(c->s) && hr_err_is_fatal(conn_read(c, now)))
        c->want_close = 1;
      if (c->state == CS_DEAD && c->work_inflight == 0 &&
          !hr_session_callbacks_parked(c->s)) {
        list_remove(&e->dead, c);
        conn_free(c);
      }
    }
  }
}

static void wake_io(hr_engine *e, hr_tstamp now) {
  uint64_t v;
  ssize_t n;

  do {
    n = read(e->wake_fd, &v, sizeof v);
  } while (n < 0 && errno == EINTR);
  reap_jobs(e, now);
  if (e->ext) {
    e->in_user_cb++;
    e->ext->run(e->ext);
    e->in_user_cb--;
  }
  if (e->cfg.on_wakeup) {
    e->in_user_cb++;
    e->cfg.on_wakeup(e, e->cfg.user_data);
    e->in_user_cb--;
  }
}

/* ------------------------------------------------------------------------ */
/* Public API                                                                */
/* ------------------------------------------------------------------------ */

void hr_engine_config_default(hr_engine_config *c) {
  memset(c, 0, sizeof *c);
  c->version = HR_ENGINE_CONFIG_VERSION;
  hr_settings_default(&c->session);
  c->worker_threads = 0;
  c->max_connections = 1024;
  c->max_inflight_bytes = 1ull << 30;
  c->drain_timeout = 30ull * 1000000000ull;
  c->io_budget = 16u << 20;
  c->socket_buffer = 0;
  c->max_put_bytes = 1ull << 30;
  c->max_conn_inflight_bytes = 1ull << 30;
}

/* The randomness of SESSION_TOKENs. */
static int engine_random(void *buf, size_t len, void *ud) {
  uint8_t *p = buf;

  (void)ud;
  while (len) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int copy_settings(hr_engine *e) {
  hr_settings *s = &e->cfg.session;

  if (s->devices && s->device_count) {
    e->devices_copy = hr__mem_malloc(&e->mem, s->device_count);
    if (!e->devices_copy)
      return HR_ERR_NOMEM;
    memcpy(e->devices_copy, s->devices, s->device_count);
    s->devices = e->devices_copy;
  }
  if (s->auth_token && s->auth_token_len) {
    e->token_copy = hr__mem_malloc(&e->mem, s->auth_token_len);
    if (!e->token_copy)
      return HR_ERR_NOMEM;
    memcpy(e->token_copy, s->auth_token, s->auth_token_len);
    s->auth_token = e->token_copy;
  }
  if (s->peer_name) {
    size_t n = strlen(s->peer_name) + 1;
    e->peer_name_copy = hr__mem_malloc(&e->mem, n);
    if (!e->peer_name_copy)
      return HR_ERR_NOMEM;
    memcpy(e->peer_name_copy, s->peer_name, n);
    s->peer_name = e->peer_name_copy;
  }
  return 0;
}

#ifdef HR_HAVE_FABRIC
static void fabric_wake(void *ctx) {
  hr_engine_wakeup(ctx);
}
#endif

/* The RDMA data plane: opens (or takes) the fabric, puts it into the
 * sessions' settings with the FABRIC_ADDRESS extension, and watches its
 * completion fd. */
static int fabric_open(hr_engine *e) {
  e->fab_fd = -1;
#ifdef HR_HAVE_FABRIC
  hr_settings *s = &e->cfg.session;
  struct hr_fabric *f = e->cfg.fabric;
  uint8_t addr[520];
  int64_t n;
  int rv;

  if (!f && !(e->cfg.fabric_provider && e->cfg.fabric_provider[0]))
    return 0;
  if (!f) {
    hr_fabric_config fc;
    char why[256] = "";
    hr_fabric_config_default(&fc);
    if (strcmp(e->cfg.fabric_provider, "auto") != 0)
      fc.provider = e->cfg.fabric_provider;
    fc.node = e->cfg.fabric_node;
    rv = hr_fabric_new(&f, &fc, &e->mem, why, sizeof why);
    if (rv)
      return rv;
    e->own_fabric = 1;
  }
  e->fabric = f;
  n = hr_fabric_address(f, addr, sizeof addr);
  if (n > 0)
    n = hr_ext_put(e->fab_ext, sizeof e->fab_ext, HR_EXT_FABRIC_ADDRESS, addr,
                   (uint16_t)n);
  if (n <= 0) {
    rv = HR_ERR_INTERNAL;
    goto fail;
  }
  s->fabric_ops = hr_fabric_get_ops();
  s->fabric_ctx = f;
  s->fabric_caps =
      e->cfg.fabric_caps ? e->cfg.fabric_caps : hr_fabric_capabilities(f);
  s->hello_ext = e->fab_ext;
  s->hello_ext_len = (uint16_t)n;
  s->hello_ext_count = 1;
  /* The staged RDMA sources of all its sessions share one budget. */
  s->rdma_stage_account = hr__stage_account_new(&e->mem);
  if (!s->rdma_stage_account) {
    rv = HR_ERR_NOMEM;
    goto fail;
  }
  /* A tensor freed on another thread queues its registrations' closing:
   * the loop wakes and progresses the fabric, which closes them. */
  hr_fabric_set_wake(f, fabric_wake, e);
  e->fab_fd = hr_fabric_fd(f);
  if (e->fab_fd >= 0) {
    e->fab_obj.kind = OBJ_FABRIC;
    rv = fdmap_set(e, e->fab_fd, &e->fab_obj);
    if (rv == 0)
      rv = watch(e, e->fab_fd, HR_POLL_IN, &e->fab_watching, &e->fab_cookie);
    if (rv) {
      fdmap_set(e, e->fab_fd, NULL);
      goto fail;
    }
  }
  return 0;
fail:
  hr__stage_account_unref(s->rdma_stage_account);
  s->rdma_stage_account = NULL;
  hr_fabric_set_wake(f, NULL, NULL);
  if (e->own_fabric)
    hr_fabric_del(f);
  e->fabric = NULL;
  e->own_fabric = 0;
  e->fab_fd = -1;
  return rv;
#else
  if (e->cfg.fabric || (e->cfg.fabric_provider && e->cfg.fabric_provider[0]))
    return HR_ERR_UNSUPPORTED;
  return 0;
#endif
}

/* Engine stop: every session (and with it every handshake) is gone; the
 * operations they started end, then the fabric closes. */
static void fabric_close(hr_engine *e) {
#ifdef HR_HAVE_FABRIC
  if (!e->fabric)
    return;
  hr_fabric_set_wake(e->fabric, NULL, NULL);
  if (e->fab_watching)
    e->ops.watch(e->loop_data, e->fab_fd, 0, &e->fab_cookie);
  if (e->fab_fd >= 0)
    fdmap_set(e, e->fab_fd, NULL);
  if (e->own_fabric) {
    for (int i = 0; i < 1000 && hr_fabric_busy(e->fabric); i++)
      hr_fabric_progress(e->fabric, now_of(e));
    if (hr_fabric_busy(e->fabric))
      hr_fabric_shutdown(e->fabric);
    hr_fabric_del(e->fabric);
  }
  e->fabric = NULL;
  hr__stage_account_unref(e->cfg.session.rdma_stage_account);
  e->cfg.session.rdma_stage_account = NULL;
#else
  (void)e;
#endif
}

struct hr_fabric *hr_engine_fabric(const hr_engine *e) {
  return e ? e->fabric : NULL;
}

int hr_engine_new(hr_engine **out, const hr_loop_ops *ops, void *loop_data,
                  const hr_engine_config *cfg, const hr_mem *mem) {
  /* The CPUs this process may use: its affinity mask capped by its
   * cgroup's CPU quota, for the bulk jobs and the pool alike. */
  return hr__engine_new_cpus(out, ops, loop_data, cfg, mem, hr__bulk_cpus());
}

int hr__engine_new_cpus(hr_engine **out, const hr_loop_ops *ops,
                        void *loop_data, const hr_engine_config *cfg,
                        const hr_mem *mem, long ncpu) {
  hr_engine *e;
  int rv;

  if (!out || !ops || ops->size < offsetof(hr_loop_ops, now) || !ops->watch ||
      !ops->timer)
    return HR_ERR_INVALID_ARGUMENT;
  if (cfg && cfg->version != HR_ENGINE_CONFIG_VERSION)
    return HR_ERR_INVALID_ARGUMENT;
  if (cfg && cfg->bulk_offload_jobs < 0)
    return HR_ERR_INVALID_ARGUMENT;
  if (!mem)
    mem = hr_mem_default();
  e = hr__mem_calloc(mem, 1, sizeof *e);
  if (!e)
    return HR_ERR_NOMEM;
  e->mem = *mem;
  e->wake_fd = -1;
  memcpy(&e->ops, ops, ops->size < sizeof e->ops ? ops->size : sizeof e->ops);
  e->ops.size = sizeof e->ops;
  e->loop_data = loop_data;
  if (cfg)
    e->cfg = *cfg;
  else
    hr_engine_config_default(&e->cfg);
  if (e->cfg.io_budget == 0)
    e->cfg.io_budget = 16u << 20;
  if (e->cfg.drain_timeout == 0)
    e->cfg.drain_timeout = 30ull * 1000000000ull;
  if (e->cfg.max_put_bytes == 0)
    e->cfg.max_put_bytes = 1ull << 30;
  if (e->cfg.max_conn_inflight_bytes == 0)
    e->cfg.max_conn_inflight_bytes = 1ull << 30;
  rv = copy_settings(e);
  if (rv == 0 && e->cfg.tls_server)
    rv = hr__tls_ctx_new(&e->tls_srv, 1, e->cfg.tls_server, &e->mem, NULL, 0);
  if (rv == 0 && e->cfg.tls_client)
    rv = hr__tls_ctx_new(&e->tls_cli, 0, e->cfg.tls_client, &e->mem, NULL, 0);
  /* The config's TLS pointers are only read here. */
  e->cfg.tls_server = e->cfg.tls_client = NULL;
  if (rv)
    goto fail;
  e->bulk_min = e->cfg.bulk_offload_min ? e->cfg.bulk_offload_min
                                         : (uint64_t)1 << 20;
  e->bulk_max_remote = hr__bulk_jobs_max(e->cfg.bulk_offload_jobs, ncpu, 0);
  e->bulk_max_local = hr__bulk_jobs_max(e->cfg.bulk_offload_jobs, ncpu, 1);
  e->pool_threads = e->cfg.worker_threads;
  if (e->pool_threads == 0)
    e->pool_threads = ncpu < 1 ? 1 : ncpu > 8 ? 8 : (unsigned)ncpu;
  e->timer_at = HR_TSTAMP_NEVER;
  e->staging = hr__mem_malloc(&e->mem, STAGING_SIZE);
  if (!e->staging) {
    rv = HR_ERR_NOMEM;
    goto fail;
  }
  e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (e->wake_fd < 0) {
    rv = HR_ERR_IO;
    goto fail;
  }
  e->wake.kind = OBJ_WAKE;
  rv = fdmap_set(e, e->wake_fd, &e->wake);
  if (rv)
    goto fail;
  rv = hr_registry_new(&e->reg, engine_random, NULL, &e->mem);
  if (rv)
    goto fail;
  rv = e->ops.watch(e->loop_data, e->wake_fd, HR_POLL_IN, &e->wake_cookie);
  if (rv)
    goto fail;
  rv = fabric_open(e);
  if (rv) {
    e->ops.watch(e->loop_data, e->wake_fd, 0, &e->wake_cookie);
    goto fail;
  }
  *out = e;
  return 0;
fail:
  hr__tls_ctx_del(e->tls_srv);
  hr__tls_ctx_del(e->tls_cli);
  hr_registry_del(e->reg);
  if (e->wake_fd >= 0)
    close(e->wake_fd);
  hr__mem_free(&e->mem, e->fdmap);
  hr__mem_free(&e->mem, e->staging);
  hr__mem_free(&e->mem, e->devices_copy);
  hr__mem_free(&e->mem, e->token_copy);
  hr__mem_free(&e->mem, e->peer_name_copy);
  hr__mem_free(mem, e);
  return rv;
}

int hr_engine_on_fd(hr_engine *e, int fd, int revents) {
  obj *o;
  hr_tstamp now;
  int rv = 0;

  if (!e)
    return HR_ERR_INVALID_ARGUMENT;
  if (e->depth)
    return HR_ERR_IN_CALLBACK;
  o = fdmap_get(e, fd);
  if (!o)
    return 0;
  e->depth++;
  now = now_of(e);
  switch (o->kind) {
  case OBJ_LISTENER: listener_io((hr_listener *)o, now); break;
  case OBJ_WAKE: wake_io(e, now); break;
#ifdef HR_HAVE_FABRIC
  case OBJ_FABRIC: hr_fabric_progress(e->fabric, now); break;
#endif
  case OBJ_CONN: {
    hr_conn *c = (hr_conn *)o;
    if (c->state == CS_LINGER)
      linger_io(c, revents, now);
    else if (c->state == CS_CONNECTING || c->state == CS_OPEN)
      rv = conn_io(c, revents, now);
    if (hr_err_is_fatal(rv)) {
      c->want_close = 1;
      conn_note(c, rv, "session failed", 0);
      rv = 0;
    }
    break;
  }
  default: break;
  }
  e->depth--;
  settle(e);
  return hr_err_is_fatal(rv) ? rv : 0;
}

/* The handshake timeout ran out while `c` still connected: its message
 * (the session's, "handshake timeout") names the address it was trying
 * last. */
static void conn_timeout_note(hr_conn *c) {
  char name[HR_SOCK_PEER_MAX];
  size_t n = strlen(c->message);

  hr__sock_addr_name(&c->lane_sa, name, sizeof name);
  if (name[0] && n < sizeof c->message)
    snprintf(c->message + n, sizeof c->message - n, " (connecting to %s)",
             name);
}

int hr_engine_on_timeout(hr_engine *e) {
  hr_tstamp now;
  hr_conn *c, *next;

  if (!e)
    return HR_ERR_INVALID_ARGUMENT;
  if (e->depth)
    return HR_ERR_IN_CALLBACK;
  e->timer_at = HR_TSTAMP_NEVER; /* the host's one-shot timer fired */
  e->depth++;
  now = now_of(e);
  fabric_due(e, now);
  for (c = e->conns; c; c = c->next) {
    if (c->state != CS_OPEN && c->state != CS_CONNECTING)
      continue;
    if (hr_session_get_expiry(c->s) <= now) {
      int rv = hr_session_handle_expiry(c->s, now);
      if (hr_err_is_fatal(rv)) {
        c->want_close = 1;
        conn_note(c, rv, "session failed", 0);
        if (c->state == CS_CONNECTING && c->fd >= 0 && c->lane_salen)
          conn_timeout_note(c);
      }
    }
  }
  for (c = e->lingering; c; c = next) {
    next = c->next;
    if (c->linger_until <= now)
      conn_close_socket(c);
  }
  if (e->accept_paused && e->accept_resume <= now) {
    e->accept_paused = 0;
    if (!e->closing)
      listeners_watch(e, HR_POLL_IN);
  }
  if (e->closing && !e->closed_notified && e->drain_deadline <= now) {
    for (c = e->conns; c; c = c->next) {
      c->want_close = 1;
      conn_note(c, HR_ERR_TIMEOUT, "engine drain timeout", 0);
    }
    for (c = e->lingering; c; c = next) {
      next = c->next;
      conn_close_socket(c);
    }
  }
  e->depth--;
  settle(e);
  return 0;
}

int hr_engine_flush(hr_engine *e) {
  if (!e)
    return HR_ERR_INVALID_ARGUMENT;
  if (e->depth)
    return HR_ERR_IN_CALLBACK;
  settle(e);
  return 0;
}

int hr_engine_close(hr_engine *e, void (*on_closed)(hr_engine *e, void *ud),
                    void *ud) {
  hr_listener *l;

  if (!e)
    return HR_ERR_INVALID_ARGUMENT;
  if (e->closing)
    return HR_ERR_STATE;
  e->closing = 1;
  e->on_closed = on_closed;
  e->closed_ud = ud;
  e->drain_deadline = now_of(e) + e->cfg.drain_timeout;
  /* Listeners stop at once: no connection is accepted from now on. */
  for (l = e->listeners; l; l = l->next) {
    if (!l->closed && l->watching)
      watch(e, l->fd, 0, &l->watching, &l->cookie);
    l->closed = 1;
  }
  defer(e);
  return 0;
}

int hr_engine_del(hr_engine *e) {
  hr_conn *c;

  if (!e)
    return 0;
  if (e->depth || e->in_user_cb)
    return HR_ERR_IN_CALLBACK;
  if (e->conns || e->dead || (e->ext && e->ext->busy(e->ext)))
    return HR_ERR_BUSY;
  if (e->ext)
    e->ext->detach(e->ext);
  while ((c = e->lingering))
    conn_close_socket(c);
  /* A lingering connection's last bulk job may not be back yet: it was
   * stopped, so its completion comes at once. */
  for (int tries = 0; e->dead && tries < 1000; tries++) {
    struct pollfd p = {e->wake_fd, POLLIN, 0};
    poll(&p, 1, 10);
    reap_jobs(e, now_of(e));
#ifdef HR_HAVE_FABRIC
    /* A cancelled fabric operation reports its end on progress. */
    if (e->fabric)
      hr_fabric_progress(e->fabric, now_of(e));
#endif
    dead_reap(e);
  }
  while (e->listeners) {
    hr_listener *l = e->listeners;
    e->listeners = l->next;
    listener_free(e, l);
  }
  fabric_close(e);
  e->ops.watch(e->loop_data, e->wake_fd, 0, &e->wake_cookie);
  if (e->timer_at != HR_TSTAMP_NEVER)
    e->ops.timer(e->loop_data, -1);
  hr__pool_del(e->pool);
  lookups_free(e);
  hr_registry_del(e->reg);
  hr__tls_ctx_del(e->tls_srv);
  hr__tls_ctx_del(e->tls_cli);
  hr__shm_cache_close(e->shm_cache);
  close(e->wake_fd);
  if (e->ops.release)
    e->ops.release(e->loop_data);
  hr__mem_free(&e->mem, e->fdmap);
  hr__mem_free(&e->mem, e->staging);
  hr__mem_free(&e->mem, e->devices_copy);
  hr__mem_free(&e->mem, e->token_copy);
  hr__mem_free(&e->mem, e->peer_name_copy);
  {
    hr_mem mem = e->mem;
    hr__mem_free(&mem, e);
  }
  return 0;
}

hr__engine_ext **hr__engine_ext_slot(hr_engine *e) {
  return &e->ext;
}

void hr_engine_wakeup(hr_engine *e) {
  uint64_t one = 1;
  ssize_t n;

  if (!e)
    return;
  do {
    n = write(e->wake_fd, &one, sizeof one);
  } while (n < 0 && errno == EINTR);
}

size_t hr_engine_conn_count(const hr_engine *e) {
  return e ? e->nconns : 0;
}

/* The hub's name table (hr_inproc_names.h: the hub's first member), or
 * NULL without config.inproc_hub. */
static hr__inproc_names *inproc_names(hr_engine *e) {
  return (hr__inproc_names *)(void *)e->cfg.inproc_hub;
}

/* A listener serving `provider`, not yet watched (listener_start()). */
static hr_listener *listener_new(hr_engine *e, const hr_provider *provider) {
  hr_listener *l = hr__mem_calloc(&e->mem, 1, sizeof *l);

  if (!l)
    return NULL;
  memcpy(&l->prov, provider,
         provider->size < sizeof l->prov ? provider->size : sizeof l->prov);
  l->prov.size = sizeof l->prov;
  l->o.kind = OBJ_LISTENER;
  l->e = e;
  return l;
}

/* Watches listener `l` (its fd set) and links it into the engine; on
 * failure frees it. */
static int listener_start(hr_engine *e, hr_listener *l, hr_listener **out) {
  int rv = fdmap_set(e, l->fd, &l->o);

  if (rv == 0 && !e->accept_paused)
    rv = watch(e, l->fd, HR_POLL_IN, &l->watching, &l->cookie);
  if (rv) {
    listener_free(e, l);
    return rv;
  }
  l->next = e->listeners;
  e->listeners = l;
  if (out)
    *out = l;
  return 0;
}

/* hr_engine_listen("inproc:NAME"): a hand-over socket watched like a
 * listening one, its other end under NAME in the hub. */
static int inproc_listen(hr_engine *e, const char *name,
                         const hr_provider *provider, hr_listener **out) {
  hr__inproc_names *names = inproc_names(e);
  hr_listener *l;
  int rx, tx, rv;

  if (!names)
    return HR_ERR_UNSUPPORTED;
  if (!*name || strlen(name) > HR__INPROC_NAME_MAX)
    return HR_ERR_INVALID_ARGUMENT;
  l = listener_new(e, provider);
  if (!l)
    return HR_ERR_NOMEM;
  l->port = -1;
  rv = hr__inproc_handover_pair(&rx, &tx);
  if (rv) {
    hr__mem_free(&e->mem, l);
    return rv;
  }
  rv = hr__inproc_names_bind(names, name, tx); /* owns tx from here */
  if (rv) {
    close(rx);
    hr__mem_free(&e->mem, l);
    return rv;
  }
  l->fd = rx;
  l->inames = names;
  memcpy(l->iname, name, strlen(name) + 1);
  return listener_start(e, l, out);
}

int hr_engine_listen(hr_engine *e, const char *addr,
                     const hr_provider *provider, hr_listener **out) {
  hr__addr a;
  hr_listener *l;
  int fd, rv;

  if (!e || !addr || !provider || provider->size < sizeof(size_t))
    return HR_ERR_INVALID_ARGUMENT;
  if (e->closing)
    return HR_ERR_STATE;
  if (strncmp(addr, "inproc:", 7) == 0)
    return inproc_listen(e, addr + 7, provider, out);
  rv = hr__addr_parse(addr, 0, &a);
  if (rv)
    return rv;
  l = listener_new(e, provider);
  if (!l)
    return HR_ERR_NOMEM;
  fd = hr__sock_listen(&a, NULL, 0);
  if (fd < 0) {
    hr__mem_free(&e->mem, l);
    return fd;
  }
  l->fd = fd;
  l->port = hr__sock_local_port(fd);
  memcpy(l->path, a.path, sizeof l->path);
  l->tls = e->tls_srv && !a.path[0];
  return listener_start(e, l, out);
}

int hr_listener_port(const hr_listener *l) {
  return l ? l->port : -1;
}

void hr_listener_close(hr_listener *l) {
  hr_engine *e;

  if (!l || l->closed)
    return;
  e = l->e;
  if (l->watching)
    watch(e, l->fd, 0, &l->watching, &l->cookie);
  l->closed = 1;
  if (e->depth == 0)
    reap_listeners(e);
}

/* Opens the socket of client connection `c` and starts its connect to
 * the first address of `ai` that takes it (NULL: a Unix path).  Returns
 * 0, or an error with nothing left open (c->message says why). */
static int conn_socket(hr_engine *e, const hr__addr *a,
                       const struct addrinfo *ai, hr_conn *c) {
  int fd, in_progress = 0, rv;

  if (a->tls && !e->tls_cli) {
    /* "hurrays://" without tls_client: the system's trust store. */
    rv = hr__tls_ctx_new(&e->tls_cli, 0, NULL, &e->mem, c->message,
                         sizeof c->message);
    if (rv)
      return rv == HR_ERR_NOMEM ? rv : HR_ERR_IO;
  }
  if (a->inproc)
    fd = inproc_names(e) ? hr__inproc_connect(inproc_names(e), a->host,
                                              c->message, sizeof c->message)
                         : HR_ERR_UNSUPPORTED;
  else if (ai)
    fd = hr__sock_connect_ai(a, ai, &in_progress, &c->lane_sa,
                             &c->lane_salen, &c->ai_rest, c->message,
                             sizeof c->message);
  else
    fd = hr__sock_connect(a, &in_progress, c->message, sizeof c->message);
  if (fd < 0)
    return fd;
  rv = fdmap_set(e, fd, &c->o);
  if (rv == 0 && a->tls)
    rv = hr__tls_new(&c->tls, e->tls_cli, fd, a->host, c->message,
                     sizeof c->message);
  if (rv) {
    fdmap_set(e, fd, NULL);
    close(fd);
    return rv;
  }
  /* Writability reports the connect's outcome, also when it completed at
   * once (loopback); the HELLO goes out from there. */
  rv = watch(e, fd, HR_POLL_OUT, &c->watching, &c->cookie);
  if (rv) {
    fdmap_set(e, fd, NULL);
    hr__tls_del(c->tls);
    c->tls = NULL;
    close(fd);
    return rv;
  }
  c->fd = fd;
  return 0;
}

/* Lists client connection `c` (its socket open, or its lookup out). */
static void conn_list(hr_engine *e, hr_conn *c) {
  list_push(&e->conns, c);
  e->nconns++;
  /* The session's handshake timeout also bounds the lookup and the TCP
   * connect: the timer must be armed now, a connect that hangs reports
   * nothing. */
  if (e->depth == 0)
    update_timer(e, now_of(e));
}

/* Starts the socket connect of client connection `c` (its session made)
 * and lists it.  Returns 0, or an error with nothing left open. */
static int conn_start(hr_engine *e, const hr__addr *a,
                      const struct addrinfo *ai, hr_conn *c) {
  int rv = conn_socket(e, a, ai, c);

  if (rv == 0)
    conn_list(e, c);
  return rv;
}

/* Worker thread: the lookup itself, on the worker's copy of lookup_io. */
static void lookup_run(void *io) {
  lookup_io *lk = io;

  lk->rv = hr__sock_resolve(&lk->addr, 0, &lk->res, lk->why, sizeof lk->why);
}

/* Worker thread: the engine went while the lookup ran (hr_engine_del()):
 * the answer nobody will take. */
static void lookup_drop(void *io) {
  lookup_io *lk = io;

  if (lk->res)
    freeaddrinfo(lk->res);
}

/* Starts client connection `c` (its session made): a Unix path or a
 * numeric address connects at once; a host name is looked up on the
 * worker pool first (lookup_run), the connection waiting in CONNECTING
 * without a socket until the answer is back (lookup_done).  Returns 0, or
 * an error with nothing left open. */
static int conn_begin(hr_engine *e, hr_conn *c) {
  struct addrinfo *res = NULL;
  lookup *lk;
  int rv;

  if (c->addr.path[0] || c->addr.inproc)
    return conn_start(e, &c->addr, NULL, c);
  rv = hr__sock_resolve(&c->addr, 1, &res, c->message, sizeof c->message);
  if (rv == 0) {
    rv = conn_start(e, &c->addr, res, c);
    /* More addresses to try when this connect fails: c keeps them. */
    if (rv == 0 && c->ai_rest) {
      c->ais = res;
    } else {
      c->ai_rest = NULL;
      freeaddrinfo(res);
    }
    return rv;
  }
  if (rv != HR_ERR_WOULDBLOCK)
    return rv;
  rv = engine_pool(e);
  if (rv)
    return rv;
  lk = hr__mem_calloc(&e->mem, 1, sizeof *lk);
  if (!lk)
    return HR_ERR_NOMEM;
  lk->j.base.run_io = lookup_run;
  lk->j.base.drop_io = lookup_drop;
  lk->j.base.io = &lk->io;
  lk->j.base.io_len = sizeof lk->io;
  lk->j.c = c;
  lk->io.addr = c->addr;
  rv = hr__pool_submit(e->pool, &lk->j.base);
  if (rv) {
    hr__mem_free(&e->mem, lk);
    return rv;
  }
  lk->next = e->lookups;
  e->lookups = lk;
  c->lookup = lk;
  conn_list(e, c);
  return 0;
}

/* Loop thread (wake_io): a lookup came back.  Its connection, unless it
 * went meanwhile, connects to the answer, or fails with the lookup's
 * error through its callback from the settle that follows. */
static void lookup_done(hr_engine *e, lookup *lk) {
  hr_conn *c = lk->j.c;
  lookup **pp;
  int rv;

  for (pp = &e->lookups; *pp != lk; pp = &(*pp)->next)
    ;
  *pp = lk->next;
  if (c) {
    c->lookup = NULL;
    rv = lk->io.rv ? lk->io.rv : conn_socket(e, &c->addr, lk->io.res, c);
    if (rv == 0 && c->ai_rest) {
      /* More addresses to try when this connect fails: c keeps them. */
      c->ais = lk->io.res;
      lk->io.res = NULL;
    }
    if (rv) {
      c->ai_rest = NULL;
      c->want_close = 1;
      conn_note(c, rv, lk->io.rv && lk->io.why[0] ? lk->io.why : NULL, 0);
    }
  }
  if (lk->io.res)
    freeaddrinfo(lk->io.res);
  hr__mem_free(&e->mem, lk);
}

/* hr_engine_del(), after hr__pool_del(): the lookups whose connection
 * went and that were not taken back.  Those done hold their answer; those
 * queued or abandoned hold none (an abandoned worker frees its own). */
static void lookups_free(hr_engine *e) {
  lookup *lk;

  while ((lk = e->lookups)) {
    e->lookups = lk->next;
    if (lk->io.res)
      freeaddrinfo(lk->io.res);
    hr__mem_free(&e->mem, lk);
  }
}

/* An "inproc:NAME" URL into *a: 0, HR_ERR_NOT_FOUND (another kind of
 * URL), HR_ERR_UNSUPPORTED (the engine has no hub),
 * HR_ERR_INVALID_ARGUMENT (a bad name). */
static int inproc_addr(hr_engine *e, const char *url, hr__addr *a) {
  size_t len;

  if (strncmp(url, "inproc:", 7) != 0)
    return HR_ERR_NOT_FOUND;
  if (!inproc_names(e))
    return HR_ERR_UNSUPPORTED;
  len = strlen(url + 7);
  if (len == 0 || len > HR__INPROC_NAME_MAX || len >= sizeof a->host)
    return HR_ERR_INVALID_ARGUMENT;
  memset(a, 0, sizeof *a);
  memcpy(a->host, url + 7, len + 1);
  a->inproc = 1;
  return 0;
}

static int connect_lead(hr_engine *e, const char *url, unsigned lanes,
                        const hr_settings *settings, hr_conn_cb cb,
                        void *user_data, hr_conn **out) {
  hr_session_callbacks cbs;
  hr_conn *c;
  int rv;

  if (!e || !url || lanes < 1 || lanes > HR_MAX_LANES)
    return HR_ERR_INVALID_ARGUMENT;
  if (e->closing)
    return HR_ERR_STATE;
  c = conn_alloc(e, -1, HR_ROLE_CLIENT, CS_CONNECTING);
  if (!c)
    return HR_ERR_NOMEM;
  rv = inproc_addr(e, url, &c->addr);
  if (rv == HR_ERR_NOT_FOUND)
    rv = hr__addr_parse(url, 1, &c->addr);
  if (rv) {
    conn_discard(c);
    return rv;
  }
  c->cb = cb;
  c->ud = user_data;
  session_callbacks(&cbs, e, c->addr.path[0] != '\0' || c->addr.inproc);
  if (settings && e->fabric) {
    /* The engine's fabric serves sessions with the caller's settings too. */
    hr_settings own = *settings;
    own.fabric_ops = e->cfg.session.fabric_ops;
    own.fabric_ctx = e->cfg.session.fabric_ctx;
    own.fabric_caps = e->cfg.session.fabric_caps;
    own.hello_ext = e->cfg.session.hello_ext;
    own.hello_ext_len = e->cfg.session.hello_ext_len;
    own.hello_ext_count = e->cfg.session.hello_ext_count;
    own.rdma_stage_account = e->cfg.session.rdma_stage_account;
    rv = hr_session_new(&c->s, HR_ROLE_CLIENT, &own, &cbs, NULL, c, now_of(e),
                        &e->mem);
  } else {
    rv = hr_session_new(&c->s, HR_ROLE_CLIENT,
                        settings ? settings : &e->cfg.session, &cbs, NULL, c,
                        now_of(e), &e->mem);
  }
  if (rv == 0 && lanes > 1) {
    c->lanes_wanted = lanes;
    rv = hr_group_new(&c->grp, c->s);
  }
  if (rv == 0)
    rv = conn_begin(e, c);
  if (rv) {
    conn_discard(c);
    return rv;
  }
  if (out)
    *out = c;
  return 0;
}

int hr_engine_connect(hr_engine *e, const char *url,
                      const hr_settings *settings, hr_conn_cb cb,
                      void *user_data, hr_conn **out) {
  return connect_lead(e, url, 1, settings, cb, user_data, out);
}

int hr_engine_connect_group(hr_engine *e, const char *url, unsigned lanes,
                            const hr_settings *settings, hr_conn_cb cb,
                            void *user_data, hr_conn **out) {
  return connect_lead(e, url, lanes, settings, cb, user_data, out);
}

unsigned hr_conn_lanes(const hr_conn *c) {
  if (!c || c->state == CS_DEAD)
    return 0;
  return c->grp ? hr_group_open_lanes(c->grp) : 1;
}

hr_session *hr_conn_session(hr_conn *c) {
  if (!c || c->state == CS_DEAD)
    return NULL;
  return c->s;
}

void hr_conn_close(hr_conn *c) {
  hr_conn *l;

  if (!c || (c->state != CS_OPEN && c->state != CS_CONNECTING))
    return;
  c->graceful_req = 1;
  for (l = c->lanes; l; l = l->lane_next)
    l->graceful_req = 1;
  defer(c->e);
}

void hr_conn_abort(hr_conn *c) {
  hr_conn *l;

  if (!c || (c->state != CS_OPEN && c->state != CS_CONNECTING))
    return;
  c->want_close = 1;
  conn_note(c, HR_ERR_CLOSED, "closed by the application", 0);
  for (l = c->lanes; l; l = l->lane_next) {
    l->want_close = 1;
    conn_note(l, HR_ERR_CLOSED, "closed by the application", 0);
  }
  defer(c->e);
}

int hr_conn_error(const hr_conn *c, uint32_t *wire_error, int *sent,
                  const char **message) {
  if (!c)
    return HR_ERR_INVALID_ARGUMENT;
  if (wire_error)
    *wire_error = c->wire_error;
  if (sent)
    *sent = c->wire_sent;
  if (message)
    *message = c->message;
  return c->close_status;
}

void hr_conn_bytes(const hr_conn *c, uint64_t *rx, uint64_t *tx) {
  uint64_t r = c ? c->rx_bytes : 0, t = c ? c->tx_bytes : 0;
  const hr_conn *l;

  for (l = c ? c->lanes : NULL; l; l = l->lane_next) {
    r += l->rx_bytes;
    t += l->tx_bytes;
  }
  if (rx)
    *rx = r;
  if (tx)
    *tx = t;
}

void hr_conn_set_tap(hr_conn *c, hr_tap_fn rx, hr_tap_fn tx, void *user_data) {
  if (!c)
    return;
  c->tap_rx = rx;
  c->tap_tx = tx;
  c->tap_ud = user_data;
}

int hr_conn_peer_cred(const hr_conn *c, hr_peer_cred *out) {
  if (!c || !out)
    return HR_ERR_INVALID_ARGUMENT;
  if (!c->has_cred)
    return HR_ERR_UNSUPPORTED;
  *out = c->cred;
  return 0;
}

int hr_conn_tls_info(const hr_conn *c, hr_tls_info *out) {
  if (!c || !out || c->state == CS_DEAD)
    return HR_ERR_INVALID_ARGUMENT;
  if (!c->tls)
    return HR_ERR_UNSUPPORTED;
  return hr__tls_info(c->tls, out);
}

/* ---- logs and metrics ---- */

const char *hr_conn_peer(const hr_conn *c) {
  return c ? c->peer : "";
}

int hr_conn_role(const hr_conn *c) {
  return c ? c->role : -1;
}

size_t hr_engine_stream_count(const hr_engine *e) {
  const hr_conn *c;
  size_t n = 0;

  if (!e)
    return 0;
  for (c = e->conns; c; c = c->next)
    if (c->s)
      n += hr_session_stream_count(c->s);
  return n;
}
