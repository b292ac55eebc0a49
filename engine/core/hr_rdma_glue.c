/*
 * The RDMA data plane inside the session (docs/protocol.md § 16): the glue
 * between the sans-IO session and the sans-IO handshake of
 * fabric/hr_rdma_sm.c.  The session reaches the fabric only through the
 * hr_fabric_ops table its settings name, so the fake fabric of the tests
 * drives it exactly as the engine's libfabric backend does.
 *
 * One hr_rdma_conn per connection (made when both HELLOs are in), one
 * hr_rdma per tensor and stream id:
 *  - source owner (server GET, client PUT): a single plain tensor sent
 *    straight from memory goes over RDMA when hr_rdma_conn_can_source()
 *    agrees; the descriptor then carries data_plane 1 and the part waits in
 *    HR_TXP_RDMA until the handshake's events end it.  A device tensor is
 *    read from the device (GPUDirect, decision 70) or, like transcoded
 *    output, from a host copy made first (hr_rdma_stage.c, decision 76);
 *  - receiver (client GET, server PUT): a descriptor with data_plane 1 lands
 *    in the tensor the session allocated (or the application's destination
 *    buffer), each buffer of which must be one contiguous run;
 *  - RDMA_REGISTER, RDMA_READY, TENSOR_DATA_END, TENSOR_PUT_ACK, ERROR and
 *    CANCEL of such a stream go to the handshake while it runs; its events
 *    come back here and finish the stream as frames would have.
 *
 * Fallback (§ 25.2): a failure of the data plane ends the stream with
 * ERROR; the requester (the client) retries the request once on the same
 * connection, which then uses frames (or no destination registration),
 * and the new stream's record says why in `fallback`.  A retried request
 * completes under its new stream id.
 *
 * Handshake events may arrive from the fabric's progress call, outside any
 * session call: each event is bracketed like a public call, so that
 * streams it ends are freed only when the outermost call returns.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "hr_session_int.h"

#ifdef HR_HAVE_FABRIC

#include <hurray/fabric.h>

#define EXT_MAX 1024u
#define ADDR_MAX 128u

/* What the data plane may touch until its release callback: it outlives
 * the stream and even the session.  A live hold is in its session's list
 * (until that session is freed), so that a client PUT ending early finds
 * the registrations the fabric may still read and parks its callback on
 * them (decision 78). */
typedef struct hold {
  hr_mem mem;
  hr_tensor *t; /* reference */
  struct hold *next;
  struct hr_rdma_glue *g; /* NULL once the session is freed */
  uint32_t sid;
  hr_put_tail *tail; /* a PUT's parked callback, or NULL */
} hold;

/* One handshake. */
typedef struct xfer {
  struct xfer *next;
  hr_session *s; /* the stream's owner */
  hr_stream *st;
  uint32_t sid;
  int side;
  hr_rdma *x;
} xfer;

/* A client request kept for its one retry. */
typedef struct keep {
  struct keep *next;
  hr_stream *st;
  int retried; /* this request is the retry: no second one */
  uint16_t key_len;
  uint8_t key[HR_MAX_KEY];
  uint64_t roff[HR_MAX_RANK];
  uint64_t rshape[HR_MAX_RANK];
} keep;

/* A device GET's RDMA receive waiting for its device memory, which a
 * work item allocates (hr_devrx.c): the registration and the receives
 * need it, so the setup waits (hr__rdma_rx_resume), and what the sender
 * sends meanwhile (its RDMA_REGISTER SOURCE; TENSOR_DATA_END of an empty
 * tensor) is kept for the handshake.  The sender waits for our answer
 * anyway: nothing changes on the wire but its timing. */
#define PEND_MSGS 1u
typedef struct pend {
  struct pend *next;
  hr_stream *st;
  uint32_t sid;
  hr_descriptor desc; /* params_raw cleared: the handshake needs none */
  hr_transport_fields xp;
  unsigned nmsg;
  hr_msg msg[PEND_MSGS];
  uint8_t *raw[PEND_MSGS]; /* msg[i]'s raw key, copied */
} pend;

typedef struct hr_rdma_glue hr_rdma_glue;
struct hr_rdma_glue {
  const hr_fabric_ops *ops;
  void *ctx;
  uint32_t caps;
  uint8_t ext[EXT_MAX];
  uint16_t ext_len, ext_count;
  uint8_t addr[ADDR_MAX];
  size_t addr_len;
  int destination;
  uint64_t min_bytes;
  hr_rdma_conn *conn;     /* once established */
  hr_stage_account *acct; /* staged sources' budget (hr_rdma_stage.c) */
  uint64_t stage_budget;
  xfer *xs;
  hold *holds; /* not released yet */
  keep *keeps;
  pend *pends;
};

int hr__rdma_session_init(hr_session *s, const hr_settings *in) {
  if (!in->fabric_ops)
    return 0;
  if (in->fabric_ops->size < sizeof(hr_fabric_ops) ||
      in->hello_ext_len > EXT_MAX || (in->hello_ext_len && !in->hello_ext))
    return HR_ERR_INVALID_ARGUMENT;
  hr_rdma_glue *g = hr__mem_calloc(&s->mem, 1, sizeof *g);
  if (!g)
    return HR_ERR_NOMEM;
  g->ops = in->fabric_ops;
  g->ctx = in->fabric_ctx;
  g->caps = in->fabric_caps & (HR_CAP_RDMA_DATA_PLANE | HR_CAP_RDMA_GPUDIRECT);
  if (!(g->caps & HR_CAP_RDMA_DATA_PLANE))
    g->caps = 0;
  if (in->hello_ext_len)
    memcpy(g->ext, in->hello_ext, in->hello_ext_len);
  g->ext_len = in->hello_ext_len;
  g->ext_count = in->hello_ext_count;
  g->destination = in->rdma_destination;
  g->min_bytes = in->rdma_min_bytes;
  g->stage_budget = in->rdma_stage_budget;
  g->acct = in->rdma_stage_account
                ? hr__stage_account_ref(in->rdma_stage_account)
                : hr__stage_account_new(&s->mem);
  if (!g->acct) {
    hr__mem_free(&s->mem, g);
    return HR_ERR_NOMEM;
  }
  s->rdma = g;
  return (int)g->caps;
}

static void xfer_drop(hr_rdma_glue *g, xfer *xf) {
  for (xfer **pp = &g->xs; *pp; pp = &(*pp)->next)
    if (*pp == xf) {
      *pp = xf->next;
      break;
    }
  hr_rdma_del(xf->x);
  hr_mem mem = xf->s->mem;
  hr__mem_free(&mem, xf);
}

static void pend_free(hr_session *s, pend *p) {
  for (unsigned i = 0; i < p->nmsg; i++)
    hr__mem_free(&s->mem, p->raw[i]);
  hr__mem_free(&s->mem, p);
}

/* Unlinks and returns st's waiting receive, or NULL. */
static pend *pend_take(hr_rdma_glue *g, const hr_stream *st) {
  for (pend **pp = &g->pends; *pp; pp = &(*pp)->next)
    if ((*pp)->st == st) {
      pend *p = *pp;
      *pp = p->next;
      return p;
    }
  return NULL;
}

static pend *pend_find(hr_rdma_glue *g, const hr_stream *st, uint32_t sid) {
  for (pend *p = g->pends; p; p = p->next)
    if (p->st == st && p->sid == sid)
      return p;
  return NULL;
}

void hr__rdma_session_free(hr_session *s) {
  hr_rdma_glue *g = s->rdma;
  if (!g)
    return;
  while (g->pends) {
    pend *p = g->pends;
    g->pends = p->next;
    pend_free(s, p);
  }
  while (g->xs)
    xfer_drop(g, g->xs);
  /* The fabric may release what it still holds after the session. */
  for (hold *h = g->holds; h; h = h->next)
    h->g = NULL;
  g->holds = NULL;
  while (g->keeps) {
    keep *k = g->keeps;
    g->keeps = k->next;
    hr__mem_free(&s->mem, k);
  }
  hr_rdma_conn_del(g->conn);
  hr__stage_account_unref(g->acct);
  hr__mem_free(&s->mem, g);
  s->rdma = NULL;
}

const uint8_t *hr__rdma_hello_ext(const hr_session *s, uint16_t *len,
                                  uint16_t *count) {
  const hr_rdma_glue *g = s->rdma;
  if (!g || !g->caps || !g->ext_len)
    return NULL;
  *len = g->ext_len;
  *count = g->ext_count;
  return g->ext;
}

int hr_session_set_peer_addr(hr_session *s, const void *addr, size_t len) {
  if (!s || !addr || len == 0 || len > ADDR_MAX)
    return HR_ERR_INVALID_ARGUMENT;
  if (s->state != HR_CS_AWAIT_HELLO)
    return HR_ERR_STATE;
  hr_rdma_glue *g = s->rdma;
  if (g) {
    memcpy(g->addr, addr, len);
    g->addr_len = len;
  }
  return 0;
}

int hr__rdma_established(hr_session *s) {
  hr_rdma_glue *g = s->rdma;
  if (!g || !g->caps || g->conn)
    return 0;
  hr_rdma_conn_config cc;
  hr_rdma_conn_config_init(&cc, g->ops, g->ctx, s->our_caps, &s->peer);
  if (g->addr_len) {
    cc.ctl_addr = g->addr;
    cc.ctl_addr_len = g->addr_len;
  }
  if (g->min_bytes)
    cc.min_bytes = g->min_bytes;
  int rv = hr_rdma_conn_new(&g->conn, &cc, &s->mem);
  return rv == HR_ERR_NOMEM ? rv : rv ? HR_ERR_INTERNAL : 0;
}

/* ---- records and failures ------------------------------------------------ */

/* Adds `why` to the record's fallback ("; " between reasons). */
static void note_fallback(hr_stream *st, const char *why) {
  if (!why || !why[0])
    return;
  char *f = st->rec.fallback;
  size_t n = strlen(f), cap = sizeof st->rec.fallback;
  if (n == 0)
    snprintf(f, cap, "%s", why);
  else if (n + 3 < cap && !strstr(f, why))
    snprintf(f + n, cap - n, "; %s", why);
}

static keep *keep_find(hr_rdma_glue *g, const hr_stream *st) {
  for (keep *k = g->keeps; k; k = k->next)
    if (k->st == st)
      return k;
  return NULL;
}

static void keep_drop(hr_session *s, hr_rdma_glue *g, const hr_stream *st) {
  for (keep **pp = &g->keeps; *pp; pp = &(*pp)->next)
    if ((*pp)->st == st) {
      keep *k = *pp;
      *pp = k->next;
      hr__mem_free(&s->mem, k);
      return;
    }
}

int hr__rdma_get_keep(hr_session *s, hr_stream *st, const hr_get_opts *o) {
  hr_rdma_glue *g = s->rdma;
  if (!g || !g->caps)
    return 0;
  keep *k = hr__mem_calloc(&s->mem, 1, sizeof *k);
  if (!k)
    return HR_ERR_NOMEM;
  k->st = st;
  k->key_len = o->key_len;
  memcpy(k->key, o->key, o->key_len);
  if (o->flags & HR_REQ_REGION)
    for (unsigned i = 0; i < o->region_rank; i++) {
      k->roff[i] = o->region_offset[i];
      k->rshape[i] = o->region_shape[i];
    }
  k->next = g->keeps;
  g->keeps = k;
  return 0;
}

/* Marks the request on `id` as a retry carrying `why`. */
static int mark_retry(hr_session *s, uint32_t id, const char *why) {
  hr_stream *nst = hr__stream_find(s, id);
  if (!nst)
    return 0;
  note_fallback(nst, why);
  hr_rdma_glue *g = s->rdma;
  keep *k = keep_find(g, nst);
  if (!k) {
    k = hr__mem_calloc(&s->mem, 1, sizeof *k);
    if (!k)
      return HR_ERR_NOMEM;
    k->st = nst;
    k->next = g->keeps;
    g->keeps = k;
  }
  k->retried = 1;
  return 0;
}

/* The old stream of a retried request ends without its callback. */
static void end_silently(hr_session *s, hr_stream *st, uint32_t sid) {
  int rv = st->kind == HR_SK_CLI_GET ? hr__cli_cancel_others(s, st, sid) : 0;
  if (rv)
    hr__fatal(s, rv);
  st->cb_done = 1;
  hr__discard_add(s, st->id, st->last);
  hr__stream_end(s, st);
}

/* Client: the request again, on the same connection.  Returns 1 when the
 * retry is under way (the old stream ended silently), 0 when it cannot be
 * retried, or fatal. */
static int retry(hr_session *s, hr_stream *st, uint32_t sid, const char *why) {
  hr_rdma_glue *g = s->rdma;
  keep *k = keep_find(g, st);
  if ((k && k->retried) || st->cb_done || st->cg.cancelling ||
      (st->kind == HR_SK_CLI_PUT && st->tx.failed))
    return 0;
  if (st->kind == HR_SK_CLI_GET && !k)
    return 0;
  /* The old request stops counting against max_streams now. */
  int was_counted = st->counted;
  if (was_counted) {
    st->counted = 0;
    s->nrequests--;
  }
  uint32_t id = 0;
  int rv;
  if (st->kind == HR_SK_CLI_GET) {
    hr_get_opts o = st->cg.opts;
    o.key = k->key;
    o.key_len = k->key_len;
    o.region_offset = k->roff;
    o.region_shape = k->rshape;
    o.dest = st->cg.has_dest ? &st->cg.dest : NULL;
    rv = hr_session_get(s, &o, st->cg.cb, st->cg.ud, &id);
  } else {
    rv = hr_session_put(s, st->pkey, st->tx.put_key_len, st->tx.put_flags,
                        st->tx.parts[0].t, st->put_cb, st->cb_ud, &id);
  }
  if (rv) {
    if (was_counted) {
      st->counted = 1;
      s->nrequests++;
    }
    return hr_err_is_fatal(rv) ? rv : 0;
  }
  rv = mark_retry(s, id, why);
  /* What the fabric may still read for the old stream now holds back
   * the retry's callback (decision 78). */
  for (hold *h = g->holds; h; h = h->next)
    if (h->sid == st->id && st->kind == HR_SK_CLI_PUT)
      h->sid = id;
  end_silently(s, st, sid);
  return rv ? rv : 1;
}

/* Ends stream `st` (the handshake on `sid` failed): the ERROR already went
 * (or came); the record gets the reason; a client retries once. */
static int fail_stream(hr_session *s, hr_stream *st, uint32_t sid, int status,
                       uint32_t wire, int sent, const char *msg,
                       const char *fallback, int may_retry) {
  if (st->ended)
    return 0;
  note_fallback(st, fallback);
  st->rec.data_plane = HR_PLANE_RDMA;
  if (may_retry && s->role == HR_ROLE_CLIENT) {
    int rv = retry(s, st, sid, fallback && fallback[0] ? fallback : msg);
    if (rv)
      return rv < 0 ? rv : 0;
  }
  hr__stream_fail(s, st, status, wire, sent, msg);
  if (s->role == HR_ROLE_CLIENT && st->kind == HR_SK_CLI_GET) {
    int rv = hr__cli_cancel_others(s, st, sid);
    if (rv)
      return rv;
  }
  hr__discard_add(s, st->id, st->last);
  hr__stream_end(s, st);
  return 0;
}

/* ---- the handshake's callbacks ------------------------------------------- */

static int cb_send_msg(hr_rdma *x, const hr_msg *m, void *ud) {
  xfer *xf = ud;
  (void)x;
  return hr__out_msg(xf->s, m, 0);
}

static void hold_release(void *ctx) {
  hold *h = ctx;
  if (h->g)
    for (hold **pp = &h->g->holds; *pp; pp = &(*pp)->next)
      if (*pp == h) {
        *pp = h->next;
        break;
      }
  /* The tensor's reference goes first: a parked PUT callback comes after
   * its release (ADR-018 § 5), as after a staging copy. */
  hr_tensor_unref(h->t);
  hr_put_tail *tail = h->tail;
  hr_mem mem = h->mem;
  hr__mem_free(&mem, h);
  hr__put_tail_drop(tail);
}

unsigned hr__rdma_put_holds(hr_session *s, const hr_stream *st) {
  hr_rdma_glue *g = s->rdma;
  unsigned n = 0;
  for (hold *h = g ? g->holds : NULL; h; h = h->next)
    n += h->sid == st->id && !h->tail;
  return n;
}

void hr__rdma_put_park(hr_session *s, const hr_stream *st, hr_put_tail *t) {
  hr_rdma_glue *g = s->rdma;
  for (hold *h = g ? g->holds : NULL; h; h = h->next)
    if (h->sid == st->id && !h->tail)
      h->tail = t;
}

/* A tensor moved over the data plane is freed: its buffers' cached
 * registrations must go (any thread; the fabric closes them on its own). */
static void tensor_freed(void *a, void *b, hr_tensor *t) {
  const hr_fabric_ops *ops = a;
  const hr_descriptor *d = hr_tensor_descriptor(t);
  for (unsigned k = 0; k < d->buffer_count; k++) {
    const void *p = hr_tensor_buffer(t, k);
    uint64_t n = d->buffers[k].size_bytes;
    hr_gpu_buf *gb = p ? NULL : hr_tensor_gpu_buf(t, k);
    if (gb) {
      /* A device tensor (a GPUDirect source or landing): its device
       * memory, all of it (a shard's region lies inside). */
      p = hr_gpu_buf_device_ptr(gb);
      n = hr_gpu_buf_size(gb);
    }
    if (p && n)
      ops->tracker_invalidate(b, p, n);
  }
  ops->tracker_unref(b);
}

/* Asks to be told when `t` is freed (once per tensor and fabric), so that
 * a cached registration never outlives its memory: the store replacing or
 * deleting a tensor, the application dropping a received one or the GET
 * whose destination buffer it wrapped. */
static int watch_tensor(hr_rdma_glue *g, hr_tensor *t) {
  const hr_fabric_ops *ops = g->ops;
  size_t need = offsetof(hr_fabric_ops, tracker_unref) + sizeof(void *);
  if (ops->size < need || !ops->tracker || !ops->tracker_invalidate ||
      !ops->tracker_unref)
    return 0; /* a backend that caches nothing */
  void *trk = ops->tracker(g->ctx);
  if (!trk)
    return HR_ERR_NOMEM;
  /* A staged region's memory outlives the tensor over it (it is reused):
   * its registrations go when the memory does. */
  int rv = hr__rstage_watch(t, ops, trk);
  if (rv == HR_ERR_UNSUPPORTED)
    rv = hr__tensor_watch(t, tensor_freed, (void *)ops, trk);
  if (rv != 0)
    ops->tracker_unref(trk); /* watched already, or out of memory */
  return rv < 0 ? rv : 0;
}

static hold *hold_new(hr_session *s, hr_tensor *t, uint32_t sid) {
  if (watch_tensor(s->rdma, t))
    return NULL;
  hold *h = hr__mem_calloc(&s->mem, 1, sizeof *h);
  if (!h)
    return NULL;
  h->mem = s->mem;
  h->t = hr_tensor_ref(t);
  h->sid = sid;
  h->g = s->rdma;
  h->next = h->g->holds;
  h->g->holds = h;
  return h;
}

/* A synthetic end (TENSOR_DATA_END or TENSOR_PUT_ACK) for the session's
 * own transfer checks, once the data plane has the bytes in place. */
static int feed_end(hr_session *s, hr_stream *st, uint32_t sid, uint32_t type) {
  hr_msg m;
  memset(&m, 0, sizeof m);
  m.hdr.type = type;
  m.hdr.stream_id = sid;
  return s->role == HR_ROLE_SERVER ? hr__srv_on_stream_msg(s, st, &m)
                                   : hr__cli_on_stream_msg(s, st, &m);
}

static int on_complete(hr_session *s, hr_stream *st, uint32_t sid, int side,
                       const hr_rdma_event *ev) {
  st->rec.data_plane = HR_PLANE_RDMA;
  if (side == HR_RDMA_SENDER) {
    hr_tx *tx = &st->tx;
    if (s->role == HR_ROLE_CLIENT) {
      /* PUT: the TENSOR_PUT_ACK arrived through the handshake. */
      tx->cur = tx->nparts;
      return hr__cli_put_acked(s, st);
    }
    /* GET: TENSOR_DATA_END is queued; the part is sent. */
    tx->cur++;
    tx->phase = HR_TXP_DESC;
    if (tx->cur >= tx->nparts)
      return hr__stream_sent(s, st);
    if (hr__tx_ready(st))
      hr__ready_add(s, st);
    return 0;
  }
  if (s->role == HR_ROLE_SERVER)
    return 0; /* PUT: hr_rdma_commit() answered; put_commit ends it */
  st->rv.bytes += ev->bytes;
  return feed_end(s, st, sid, HR_MSG_TENSOR_DATA_END);
}

static void cb_event(hr_rdma *x, const hr_rdma_event *ev, void *ud) {
  xfer *xf = ud;
  hr_session *s = xf->s;
  hr_stream *st = xf->st;
  uint32_t sid = xf->sid;
  int side = xf->side;
  (void)x;
  hr__api_enter(s);
  int rv = 0;
  switch (ev->kind) {
  case HR_RDMA_EV_DATA_READY:
    /* PUT receiver: every byte is in place; the session's checks and
     * the provider's commit follow, answered by hr__rdma_put_answer(). */
    st->rec.data_plane = HR_PLANE_RDMA;
    st->rv.bytes += ev->bytes;
    note_fallback(st, ev->fallback);
    rv = feed_end(s, st, sid, HR_MSG_TENSOR_DATA_END);
    break;
  case HR_RDMA_EV_COMPLETE:
    note_fallback(st, ev->fallback);
    xfer_drop(s->rdma, xf);
    if (!st->ended)
      rv = on_complete(s, st, sid, side, ev);
    break;
  case HR_RDMA_EV_FAILED: {
    xfer_drop(s->rdma, xf);
    int status = ev->wire_error == 0   ? HR_ERR_CLOSED
                 : ev->wire_error_sent ? hr__status_for_wire(ev->wire_error)
                                       : HR_ERR_REMOTE;
    if (status == 0)
      status = HR_ERR_PROTO;
    rv = fail_stream(s, st, sid, status, ev->wire_error, ev->wire_error_sent,
                     ev->message, ev->fallback, ev->retry);
    break;
  }
  default: break;
  }
  if (rv < 0 && hr_err_is_fatal(rv))
    hr__fatal(s, rv);
  hr__api_leave(s);
}

static const hr_rdma_callbacks rdma_cbs = {sizeof(hr_rdma_callbacks),
                                           cb_send_msg, cb_event};

static xfer *xfer_find(hr_rdma_glue *g, const hr_stream *st, uint32_t sid) {
  for (xfer *xf = g->xs; xf; xf = xf->next)
    if (xf->st == st && xf->sid == sid)
      return xf;
  return NULL;
}

/* ---- sender -------------------------------------------------------------- */

/* Creates the sender's handshake of part `p` over `region` (desc and
 * bufs: host memory, or the device's for a GPUDirect source), which
 * registers the source.  Returns 1, 0 when the fabric refused (why, after
 * `what` when not NULL, in `out`, else in the record: frames), or
 * HR_ERR_NOMEM. */
static int sender_new(hr_session *s, hr_rdma_glue *g, hr_stream *st, hr_part *p,
                      const hr_descriptor *desc, void **bufs, const char *what,
                      char *out, size_t out_cap) {
  char why[160] = "";
  xfer *xf = hr__mem_calloc(&s->mem, 1, sizeof *xf);
  hold *h = hold_new(s, p->hold, st->id);
  if (!xf || !h) {
    hr__mem_free(&s->mem, xf);
    if (h)
      hold_release(h);
    return HR_ERR_NOMEM;
  }
  hr_rdma_config rc;
  memset(&rc, 0, sizeof rc);
  rc.side = HR_RDMA_SENDER;
  rc.direction = s->role == HR_ROLE_SERVER ? HR_RDMA_GET : HR_RDMA_PUT;
  rc.stream_id = st->id;
  rc.desc = desc;
  rc.total_data_bytes = p->xp.total_data_bytes;
  rc.buffers = bufs;
  rc.release = hold_release;
  rc.release_ctx = h;
  xf->s = s;
  xf->st = st;
  xf->sid = st->id;
  xf->side = HR_RDMA_SENDER;
  int rv = hr_rdma_new(&xf->x, g->conn, &rc, &rdma_cbs, xf, &s->mem, NULL, why,
                       sizeof why);
  if (rv) {
    hold_release(h);
    hr__mem_free(&s->mem, xf);
    if (rv == HR_ERR_NOMEM)
      return rv;
    char fb[256];
    snprintf(fb, sizeof fb, "%s%s%s", what ? what : "", what ? ": " : "",
             why[0] ? why : hr_strerror(rv));
    if (out) {
      size_t n = strlen(fb) < out_cap ? strlen(fb) : out_cap - 1;
      memcpy(out, fb, n);
      out[n] = 0;
    } else
      note_fallback(st, fb);
    return 0;
  }
  xf->next = g->xs;
  g->xs = xf;
  return 1;
}

/* A device part (decision 70): with GPUDirect negotiated and the device's
 * memory registered by the fabric as the source region, the data plane
 * reads it straight from the device.  The producer's event comes first
 * (ADR-018: the network declares SYNC_PRODUCER_SYNCED): the handshake is
 * made (the registration reads no byte), then hr_send.c waits for the
 * event on the device without blocking this thread, and calls here again
 * with p->dipc HR_DIPC_SYNCED to send the descriptor.  Returns 1,
 * HR_RDMA_TX_WAIT, 0 (staged: *why says why) or fatal. */
static int device_source(hr_session *s, hr_rdma_glue *g, hr_stream *st,
                         hr_part *p, char *why, size_t why_cap) {
  if (p->dipc == HR_DIPC_SYNCED && xfer_find(g, st, st->id))
    return 1; /* the event completed: the descriptor may go */
  const char *gd = NULL;
  hr_descriptor local;
  void *bufs[HR_MAX_BUFFERS] = {0};
  int rv = 0;
  if (hr_rdma_conn_gpudirect(g->conn, &gd) &&
      hr__rdma_src_region(p, &local, bufs, &gd) == 0) {
    rv = sender_new(s, g, st, p, &local, bufs, NULL, why, why_cap);
    if (rv < 0)
      return rv;
  } else {
    snprintf(why, why_cap, "%s", gd ? gd : "no GPUDirect");
  }
  if (rv == 0) {
    /* Staged after all (a refused registration, after an earlier wait):
     * the staging copies wait for the event themselves. */
    p->dipc = HR_DIPC_NONE;
    return 0;
  }
  if (p->dready && p->dipc != HR_DIPC_SYNCED) {
    p->dipc = HR_DIPC_WAIT;
    return HR_RDMA_TX_WAIT;
  }
  return 1;
}

/* Short texts: the record's fallback has 127 characters for them. */
static const char dev_framed[] = "device tensor staged and framed";
static const char dev_staged[] = "device tensor staged for RDMA";
static const char xc_framed[] = "transcoded output goes as frames";

/* A staged part's host region is complete (decision 76): its descriptor
 * goes with data_plane RDMA over it, or, when the fabric refuses the
 * region, as frames from it.  1, 0 or HR_ERR_NOMEM. */
static int staged_source(hr_session *s, hr_rdma_glue *g, hr_stream *st,
                         hr_part *p) {
  hr_descriptor local;
  void *bufs[HR_MAX_BUFFERS];
  if (hr__rstage_local(p, &local, bufs) != 0)
    return 0;
  return sender_new(s, g, st, p, &local, bufs, "RDMA refused the staged copy",
                    NULL, 0);
}

int hr__rdma_tx_prepare(hr_session *s, hr_stream *st, hr_part *p) {
  hr_rdma_glue *g = s->rdma;
  if (p->rstage && hr__rstage_waiting(p))
    return HR_RDMA_TX_WAIT; /* its host copy is being made */
  if (!g || !g->conn || p->shm)
    return 0; /* an SHM part's bytes are in its segment already */
  const char *u = NULL;
  uint64_t total = p->xp.total_data_bytes;
  uint64_t min = g->min_bytes ? g->min_bytes : (uint64_t)64 << 10;
  int rv;
  if (p->rstage) {
    /* Staged (decision 76): the host copy is complete. */
    rv = staged_source(s, g, st, p);
    if (rv != 1)
      return rv;
    p->xp.data_plane = HR_PLANE_RDMA;
    st->rec.data_plane = HR_PLANE_RDMA;
    return 1;
  }
  if (!hr_rdma_conn_usable(g->conn, &u)) {
    /* Not negotiated is no fallback; a peer address refused is. */
    if ((s->our_caps & s->peer.capability_flags & HR_CAP_RDMA_DATA_PLANE) &&
        total >= min)
      note_fallback(st, u);
    return 0;
  }
  if (total < min)
    return 0; /* small tensors go as frames by design */
  int dev = p->xmode == HR_XM_STAGE;
  if (st->tx.nparts != 1 || p->desc.layout.tag == HR_LAYOUT_COMPOSITE) {
    note_fallback(st, "a composite goes as frames");
    return 0;
  }
  char why[160] = "";
  if (!hr_rdma_conn_can_source(g->conn, &p->desc, total, why, sizeof why)) {
    note_fallback(st, why);
    if (dev) {
      /* The connection fell back while the producer's event was awaited:
       * the handshake made for it goes unused, and the staging copies
       * wait for the event themselves. */
      xfer *xf = xfer_find(g, st, st->id);
      if (xf)
        xfer_drop(g, xf);
      p->dipc = HR_DIPC_NONE;
    }
    return 0;
  }
  if (p->xmode == HR_XM_DIRECT) {
    void *bufs[HR_MAX_BUFFERS];
    for (unsigned k = 0; k < HR_MAX_BUFFERS; k++)
      bufs[k] = (void *)p->src[k];
    rv = sender_new(s, g, st, p, &p->desc, bufs, NULL, NULL, 0);
  } else {
    char gd[160] = "";
    rv = dev ? device_source(s, g, st, p, gd, sizeof gd) : 0;
    if (rv < 0 || rv == 1 || rv == HR_RDMA_TX_WAIT) {
      if (rv == HR_RDMA_TX_WAIT || rv < 0)
        return rv;
    } else {
      /* Not readable where it lies: a host copy of it first. */
      char sw[160] = "";
      int r =
          hr__rstage_begin(s, st, p, g->acct, g->stage_budget, sw, sizeof sw);
      char fb[256];
      if (r < 0)
        return r;
      if (dev)
        snprintf(fb, sizeof fb, "%s: %s%s%s", r ? dev_staged : dev_framed, gd,
                 r ? "" : "; ", r ? "" : sw);
      else
        snprintf(fb, sizeof fb, "%s%s%s", r ? "" : xc_framed, r ? "" : ": ",
                 r ? "" : sw);
      note_fallback(st, fb);
      if (r == 0)
        return 0;
      if (st->ended || st->tx.failed || hr__rstage_waiting(p))
        return HR_RDMA_TX_WAIT;
      /* Staged at once (the host ran the items inline). */
      rv = staged_source(s, g, st, p);
    }
  }
  if (rv != 1)
    return rv;
  p->xp.data_plane = HR_PLANE_RDMA;
  st->rec.data_plane = HR_PLANE_RDMA;
  return 1;
}

int hr__rdma_tx_device_first(hr_session *s, const hr_stream *st,
                             const hr_part *p) {
  hr_rdma_glue *g = s->rdma;
  uint64_t min = g && g->min_bytes ? g->min_bytes : (uint64_t)64 << 10;
  if (!g || !g->conn || p->shm || p->dipc || p->rstage || st->tx.nparts != 1 ||
      p->xp.total_data_bytes < min ||
      p->desc.layout.tag == HR_LAYOUT_COMPOSITE ||
      !hr_rdma_conn_can_source(g->conn, &p->desc, p->xp.total_data_bytes, NULL,
                               0))
    return 0;
  if (p->xmode == HR_XM_STAGE)
    return hr_rdma_conn_gpudirect(g->conn, NULL) || g->stage_budget;
  return p->xmode == HR_XM_WINDOW && g->stage_budget;
}

int hr__rdma_tx_start(hr_session *s, hr_stream *st) {
  hr_rdma_glue *g = s->rdma;
  xfer *xf = g ? xfer_find(g, st, st->id) : NULL;
  if (!xf)
    return HR_ERR_INTERNAL;
  int rv = hr_rdma_start(xf->x);
  return rv < 0 && hr_err_is_fatal(rv) ? rv : 0;
}

/* ---- receiver ------------------------------------------------------------ */

/* A GET into device memory: with GPUDirect negotiated and the fabric able
 * to register this device's memory (tried once here: a provider that
 * registers it has FI_HMEM for it, so its tagged receives reach it too),
 * the transfer lands in the device buffers themselves; returns their
 * owner (a reference), with `local` the descriptor of that memory and
 * bufs[] its addresses.  Otherwise NULL, and the record says why: the
 * transfer then lands in host memory and goes to the device through the
 * staging ring (hr_devrx.c). */
static hr_tensor *device_landing(hr_session *s, hr_rdma_glue *g, hr_stream *st,
                                 hr_recv *rv, const hr_descriptor *d,
                                 hr_descriptor *local, void **bufs) {
  const char *gd = NULL;
  char why[128] = "";
  hr_tensor *t = NULL;
  if (!hr_rdma_conn_gpudirect(g->conn, &gd))
    ;
  else if (hr__devrx_device_region(rv, d, local, bufs))
    gd = "the device has no address the fabric can use";
  else {
    hr_fabric_region r;
    memset(&r, 0, sizeof r);
    r.device_tag = local->buffers[0].device_tag;
    r.device_index = local->buffers[0].device_index;
    r.nseg = (uint8_t)local->buffer_count;
    for (unsigned k = 0; k < local->buffer_count; k++) {
      r.seg[k].ptr = bufs[k];
      r.seg[k].len = local->buffers[k].size_bytes;
      r.length += r.seg[k].len;
    }
    hr_fabric_key key;
    void *mr = NULL;
    int rv2 = g->ops->reg(g->ctx, &r, HR_FABRIC_REMOTE_WRITE, &key, &mr, why,
                          sizeof why);
    if (rv2 == 0) {
      g->ops->dereg(g->ctx, mr);
      t = hr__devrx_rdma_device(s, rv, local);
      if (!t)
        gd = "out of memory";
    } else {
      gd = why;
    }
  }
  if (!t) {
    char fb[256];
    snprintf(fb, sizeof fb, "RDMA into host memory, copied to the device: %s",
             gd && gd[0] ? gd : "no GPUDirect");
    note_fallback(st, fb);
  }
  return t;
}

int hr__rdma_rx_begin(hr_session *s, hr_stream *st, uint32_t sid,
                      const hr_descriptor *d, const hr_transport_fields *xp) {
  s = st->s;
  hr_rdma_glue *g = s->rdma;
  if (!g || !g->conn)
    return hr__stream_error(s, sid, HR_WIRE_PROTOCOL_VIOLATION,
                            "data_plane RDMA was not negotiated");
  hr_recv *rv = &st->rv;
  if (rv->dev && hr__devrx_allocating(rv)) {
    /* The device memory is being allocated on a worker: the setup waits
     * for it (hr__rdma_rx_resume). */
    pend *p = hr__mem_calloc(&s->mem, 1, sizeof *p);
    if (!p)
      return HR_ERR_NOMEM;
    p->st = st;
    p->sid = sid;
    p->desc = *d;
    p->desc.params_raw = NULL;
    p->desc.params_len = 0;
    p->xp = *xp;
    p->next = g->pends;
    g->pends = p;
    return 0;
  }
  hr_tensor *land = rv->assembled ? rv->assembled : rv->cur ? rv->cur->t : NULL;
  void *bufs[HR_MAX_BUFFERS] = {0};
  const char *refuse = land ? NULL : "no landing tensor";
  int all_cpu = 1;
  hr_descriptor ld;
  hr_tensor *dland = NULL; /* GPUDirect: the device buffers' owner */
  if (land && rv->dev) {
    dland = device_landing(s, g, st, rv, d, &ld, bufs);
    if (dland) {
      land = dland;
      d = &ld; /* the region is device memory of our device */
    } else {
      land = hr__devrx_rdma_host(s, rv, d);
      if (!land)
        refuse = "no host memory for the device GET's RDMA landing";
    }
  }
  for (unsigned k = 0; k < d->buffer_count && !refuse && !dland; k++) {
    uint64_t run = 0, size = d->buffers[k].size_bytes;
    uint8_t *p = rv->dev ? hr_tensor_buffer(land, k)
                         : hr__recv_where(rv, sid, (uint8_t)k, 0, &run);
    if (rv->dev)
      run = size;
    if (size && (!p || run < size))
      refuse = "the landing buffer is not contiguous (a shard of this "
               "layout)";
    bufs[k] = p;
    if (d->buffers[k].device_tag != HR_DEV_CPU && !rv->dev)
      all_cpu = 0;
  }
  if (refuse) {
    /* Our own refusal, as hr_rdma's would be: RDMA_SETUP_FAILED. */
    int r = hr__out_error(s, sid, HR_WIRE_RDMA_SETUP_FAILED, refuse);
    if (r)
      return r;
    char fb[128];
    snprintf(fb, sizeof fb, "RDMA_SETUP_FAILED sent: %s", refuse);
    return fail_stream(s, st, sid, HR_ERR_UNSUPPORTED,
                       HR_WIRE_RDMA_SETUP_FAILED, 1, refuse, fb, 1);
  }
  xfer *xf = hr__mem_calloc(&s->mem, 1, sizeof *xf);
  hold *h = hold_new(s, land, sid);
  hr_tensor_unref(dland); /* the hold's reference keeps it */
  if (!xf || !h) {
    hr__mem_free(&s->mem, xf);
    if (h)
      hold_release(h);
    return HR_ERR_NOMEM;
  }
  if (dland)
    all_cpu = 0;
  hr_rdma_config rc;
  memset(&rc, 0, sizeof rc);
  rc.side = HR_RDMA_RECEIVER;
  rc.direction = s->role == HR_ROLE_CLIENT ? HR_RDMA_GET : HR_RDMA_PUT;
  rc.stream_id = sid;
  rc.desc = d;
  rc.total_data_bytes = xp->total_data_bytes;
  rc.buffers = bufs;
  /* § 16.4 rule 3: the landing memory is what the region describes:
   * host memory, or (GPUDirect) our device's. */
  rc.register_destination = g->destination && (all_cpu || dland);
  rc.release = hold_release;
  rc.release_ctx = h;
  xf->s = s;
  xf->st = st;
  xf->sid = sid;
  xf->side = HR_RDMA_RECEIVER;
  hr_wire_status ws = {0, 0, NULL};
  char why[160] = "";
  int r = hr_rdma_new(&xf->x, g->conn, &rc, &rdma_cbs, xf, &s->mem, &ws, why,
                      sizeof why);
  if (r) {
    hold_release(h);
    hr__mem_free(&s->mem, xf);
    if (r == HR_ERR_NOMEM)
      return r;
    if (r == HR_ERR_PROTO)
      return hr__stream_error(s, sid, ws.code, ws.reason);
    return hr__stream_error(s, sid, HR_WIRE_INTERNAL, why);
  }
  xf->next = g->xs;
  g->xs = xf;
  st->rec.data_plane = HR_PLANE_RDMA;
  r = hr_rdma_start(xf->x);
  return r < 0 && hr_err_is_fatal(r) ? r : 0;
}

int hr__rdma_put_answer(hr_session *s, hr_stream *st, uint32_t wire,
                        const char *text) {
  hr_rdma_glue *g = s->rdma;
  xfer *xf = g ? xfer_find(g, st, st->id) : NULL;
  if (!xf || hr_rdma_state(xf->x) != HR_RDMA_ST_AWAIT_COMMIT)
    return 0;
  int rv = hr_rdma_commit(xf->x, wire, text);
  return rv < 0 && hr_err_is_fatal(rv) ? rv : 1;
}

/* ---- messages ------------------------------------------------------------ */

static int xfer_msg(hr_session *s, xfer *xf, hr_stream *st, const hr_msg *m);

/* A message for a receive that waits for its device memory: the
 * sender's first (RDMA_REGISTER, or TENSOR_DATA_END of an empty tensor)
 * is kept for the handshake, a copy with its raw key, and judged by it
 * on resume; ERROR and CANCEL are the session's as before the
 * handshake.  1, 0, or fatal. */
static int pend_msg(hr_session *s, pend *p, const hr_msg *m) {
  uint32_t t = m->hdr.type;
  if (t != HR_MSG_RDMA_REGISTER && t != HR_MSG_RDMA_READY &&
      t != HR_MSG_TENSOR_DATA_END)
    return 0;
  if (p->nmsg == PEND_MSGS || t == HR_MSG_RDMA_READY) {
    /* The sender's first message (RDMA_REGISTER, or TENSOR_DATA_END of
     * an empty tensor) is its last before our RDMA_READY. */
    int rv = hr__stream_error(s, p->sid, HR_WIRE_PROTOCOL_VIOLATION,
                              "RDMA handshake message before our "
                              "RDMA_READY");
    return rv ? rv : 1;
  }
  hr_msg *c = &p->msg[p->nmsg];
  *c = *m;
  p->raw[p->nmsg] = NULL;
  if (t == HR_MSG_RDMA_REGISTER && m->u.rdma.raw_key_len) {
    uint8_t *raw = hr__mem_malloc(&s->mem, m->u.rdma.raw_key_len);
    if (!raw)
      return HR_ERR_NOMEM;
    memcpy(raw, m->u.rdma.raw_key, m->u.rdma.raw_key_len);
    c->u.rdma.raw_key = raw;
    p->raw[p->nmsg] = raw;
  }
  p->nmsg++;
  return 1;
}

int hr__rdma_stream_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  hr_rdma_glue *g = s->rdma;
  if (!g || (!g->xs && !g->pends))
    return 0;
  uint32_t t = m->hdr.type;
  if (t != HR_MSG_RDMA_REGISTER && t != HR_MSG_RDMA_READY &&
      t != HR_MSG_TENSOR_DATA_END && t != HR_MSG_TENSOR_PUT_ACK &&
      t != HR_MSG_ERROR && t != HR_MSG_CANCEL)
    return 0;
  pend *p = g->pends ? pend_find(g, st, m->hdr.stream_id) : NULL;
  if (p)
    return pend_msg(s, p, m);
  xfer *xf = xfer_find(g, st, m->hdr.stream_id);
  if (!xf)
    return 0;
  return xfer_msg(s, xf, st, m);
}

/* A message of the handshake `xf` on stream st: 1 (taken), 0 (the
 * session's), or fatal. */
static int xfer_msg(hr_session *s, xfer *xf, hr_stream *st, const hr_msg *m) {
  uint32_t t = m->hdr.type;
  int rv;
  if (t == HR_MSG_CANCEL) {
    /* The peer cancelled: ERROR CANCELLED through the handshake, whose
     * FAILED event ends the stream. */
    rv = hr_rdma_abort(xf->x, HR_WIRE_CANCELLED, "cancelled");
    return rv < 0 && hr_err_is_fatal(rv) ? rv : 1;
  }
  if (t == HR_MSG_RDMA_REGISTER && xf->side == HR_RDMA_RECEIVER) {
    /* The transfer's own rules first (one SOURCE, long enough). */
    hr_wire_status ws = {0, 0, NULL};
    rv = hr__recv_msg(s, st, &st->rv, m, &ws);
    if (rv == HR_ERR_PROTO) {
      rv = hr_rdma_abort(xf->x, ws.code, ws.reason);
      return rv < 0 && hr_err_is_fatal(rv) ? rv : 1;
    }
    if (rv)
      return rv;
  }
  rv = hr_rdma_on_msg(xf->x, m);
  if (rv == HR_ERR_STATE)
    return 0;
  if (rv < 0 && hr_err_is_fatal(rv))
    return rv;
  return 1;
}

int hr__rdma_rx_resume(hr_session *s, hr_stream *st) {
  hr_rdma_glue *g = s->rdma;
  pend *p = g ? pend_take(g, st) : NULL;
  if (!p)
    return 0;
  int rv = hr__rdma_rx_begin(s, st, p->sid, &p->desc, &p->xp);
  for (unsigned i = 0; i < p->nmsg && rv >= 0 && !st->ended; i++) {
    xfer *xf = xfer_find(g, st, p->sid);
    if (!xf)
      break; /* refused: the stream ended with RDMA_SETUP_FAILED */
    rv = xfer_msg(s, xf, st, &p->msg[i]);
    if (rv == 0)
      rv = hr__cli_on_stream_msg(s, st, &p->msg[i]);
  }
  pend_free(s, p);
  return rv < 0 && hr_err_is_fatal(rv) ? rv : 0;
}

void hr__rdma_stream_end(hr_session *s, hr_stream *st) {
  hr_rdma_glue *g = s->rdma;
  if (!g)
    return;
  for (pend *p; (p = pend_take(g, st));)
    pend_free(s, p);
  for (xfer *xf = g->xs, *next; xf; xf = next) {
    next = xf->next;
    if (xf->st == st)
      xfer_drop(g, xf);
  }
  keep_drop(s, g, st);
}

#else /* !HR_HAVE_FABRIC: no data plane; its messages are the session's */

int hr__rdma_session_init(hr_session *s, const hr_settings *in) {
  (void)s;
  (void)in;
  return 0;
}
void hr__rdma_session_free(hr_session *s) {
  (void)s;
}
const uint8_t *hr__rdma_hello_ext(const hr_session *s, uint16_t *len,
                                  uint16_t *count) {
  (void)s;
  (void)len;
  (void)count;
  return NULL;
}
int hr_session_set_peer_addr(hr_session *s, const void *addr, size_t len) {
  if (!s || !addr || len == 0 || len > 128)
    return HR_ERR_INVALID_ARGUMENT;
  return s->state != HR_CS_AWAIT_HELLO ? HR_ERR_STATE : 0;
}
int hr__rdma_established(hr_session *s) {
  (void)s;
  return 0;
}
int hr__rdma_stream_msg(hr_session *s, hr_stream *st, const hr_msg *m) {
  (void)s;
  (void)st;
  (void)m;
  return 0;
}
void hr__rdma_stream_end(hr_session *s, hr_stream *st) {
  (void)s;
  (void)st;
}
unsigned hr__rdma_put_holds(hr_session *s, const hr_stream *st) {
  (void)s;
  (void)st;
  return 0;
}
void hr__rdma_put_park(hr_session *s, const hr_stream *st, hr_put_tail *t) {
  (void)s;
  (void)st;
  (void)t;
}
int hr__rdma_tx_prepare(hr_session *s, hr_stream *st, hr_part *p) {
  (void)s;
  (void)st;
  (void)p;
  return 0;
}
int hr__rdma_tx_start(hr_session *s, hr_stream *st) {
  (void)s;
  (void)st;
  return HR_ERR_INTERNAL;
}
int hr__rdma_tx_device_first(hr_session *s, const hr_stream *st,
                             const hr_part *p) {
  (void)s;
  (void)st;
  (void)p;
  return 0;
}
int hr__rdma_rx_begin(hr_session *s, hr_stream *st, uint32_t sid,
                      const hr_descriptor *d, const hr_transport_fields *xp) {
  (void)d;
  (void)xp;
  return hr__stream_error(st->s, sid, HR_WIRE_PROTOCOL_VIOLATION,
                          "data_plane RDMA was not negotiated");
}
int hr__rdma_rx_resume(hr_session *s, hr_stream *st) {
  (void)s;
  (void)st;
  return 0;
}
int hr__rdma_put_answer(hr_session *s, hr_stream *st, uint32_t wire,
                        const char *text) {
  (void)s;
  (void)st;
  (void)wire;
  (void)text;
  return 0;
}
int hr__rdma_get_keep(hr_session *s, hr_stream *st, const hr_get_opts *o) {
  (void)s;
  (void)st;
  (void)o;
  return 0;
}

#endif /* HR_HAVE_FABRIC */
